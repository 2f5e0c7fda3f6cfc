//! devcomm's kernels ship with the crate: a build with no nightly toolchain
//! reachable embeds the committed PTX.

use std::path::PathBuf;
use std::process::Command;

/// `cargo check -p devcomm` in a target directory of its own, with
/// `DEVCOMM_PTX_TOOLCHAIN` naming a toolchain that does not exist (so the
/// build script cannot build PTX), and returns the build script's output
/// directory.
fn check_without_nightly() -> PathBuf {
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let target = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("no-nightly");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(&workspace)
        .args(["check", "-p", "devcomm", "--offline", "--message-format=json"])
        .env("CARGO_TARGET_DIR", &target)
        .env("DEVCOMM_PTX_TOOLCHAIN", "devcomm-test-no-such-toolchain")
        .env_remove("DEVCOMM_SKIP_PTX")
        .env_remove("DEVCOMM_PTX_ARCH")
        .env_remove("RUSTFLAGS")
        .output()
        .expect("running cargo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "cargo check failed:\n{}", String::from_utf8_lossy(&out.stderr));
    stdout
        .lines()
        .filter(|l| l.contains("\"reason\":\"build-script-executed\"") && l.contains("#devcomm@"))
        .find_map(|l| {
            let at = l.find("\"out_dir\":\"")? + "\"out_dir\":\"".len();
            Some(PathBuf::from(&l[at..at + l[at..].find('"')?]))
        })
        .unwrap_or_else(|| panic!("no build-script-executed message for devcomm in:\n{stdout}"))
}

#[test]
fn a_build_without_nightly_embeds_the_committed_kernels() {
    let out_dir = check_without_nightly();
    let embedded = std::fs::read_to_string(out_dir.join("devcomm_kernels.ptx")).expect("embedded PTX file");
    let (marker, ptx) = embedded.split_once('\n').expect("a marker line");
    assert_eq!(marker, format!("// devcomm-embedded-ptx {}", devcomm_build::committed::sha256_label(ptx)));
    let committed = devcomm_build::committed::CommittedPtx::parse(ptx).expect("the committed file's header");
    assert!(committed.toolchain.contains("nightly"), "{}", committed.toolchain);
    let entries = devcomm_build::check_ptx(&committed.body).expect("loadable PTX");
    for k in ["block_sum_u64", "axpy_f32"] {
        assert!(entries.iter().any(|e| e == k), "kernel {k} missing from {entries:?}");
    }
    // The tests' kernels are a crate of their own (`devcomm-test-kernels`), not in the library's PTX.
    for k in ["trap_at", "gin_put_all", "lsa_barrier_rounds"] {
        assert!(!entries.iter().any(|e| e == k), "test kernel {k} in the library's PTX: {entries:?}");
    }
    // It is the very file committed in the repository.
    let path = devcomm_build::committed::LIBRARY_KERNELS
        .committed_path(&PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".."), devcomm_build::DEFAULT_ARCH);
    assert_eq!(ptx, std::fs::read_to_string(path).unwrap());
}
