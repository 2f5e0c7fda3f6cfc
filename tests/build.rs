//! Embeds the test kernels (`tests/kernels`, crate `devcomm-test-kernels`)
//! as PTX, the way a project ships its own kernel crate: the committed
//! `tests/kernels/ptx/` file when it matches the sources (no nightly
//! needed), else a build from source with nightly + `rust-src`
//! (`devcomm-build`), else an error that says what to run. `src/lib.rs`
//! includes the result (`test_kernels_ptx`, `test_kernels`).
//!
//! The file starts with a marker line, `// devcomm-embedded-ptx(devcomm-test-kernels)
//! sha256:<hash of the PTX>`, by which `cargo xtask bundle` checks that the
//! test and benchmark binaries carry the test kernels it expects.
//!
//! The test kernels are embedded whatever `DEVCOMM_SKIP_PTX` says: the
//! emulated runtime reads a module's entry names from its PTX, so the tests
//! need it on every runtime. Knobs: `DEVCOMM_PTX_ARCH` (default `sm_90`),
//! `DEVCOMM_PTX_TOOLCHAIN` (default `nightly`).

use std::path::PathBuf;

use devcomm_build::committed::{self, Origin, TEST_KERNELS};

fn main() {
    for var in ["DEVCOMM_PTX_ARCH", "DEVCOMM_PTX_TOOLCHAIN"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    let manifest_dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let root = manifest_dir.parent().unwrap_or(&manifest_dir).to_path_buf();
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR")).join("devcomm_test_kernels.ptx");
    let mut builder = devcomm_build::PtxBuilder::new(TEST_KERNELS.package).manifest_dir(&root);
    if let Some(arch) = std::env::var("DEVCOMM_PTX_ARCH").ok().filter(|v| !v.is_empty()) {
        builder = builder.arch(arch);
    }
    if let Some(tc) = std::env::var("DEVCOMM_PTX_TOOLCHAIN").ok().filter(|v| !v.is_empty()) {
        builder = builder.toolchain(tc);
    }
    println!("cargo:rerun-if-changed={}", TEST_KERNELS.committed_path(&root, builder.arch_name()).display());
    for p in TEST_KERNELS.watched_paths(&root) {
        if p.exists() {
            println!("cargo:rerun-if-changed={}", p.display());
        }
    }
    match committed::resolve(&TEST_KERNELS, &root, &builder) {
        Ok((ptx, origin)) => {
            if origin != Origin::Committed {
                println!(
                    "cargo:warning=devcomm-tests: the committed test kernels ({}) are stale or missing; built them \
                     from source. Refresh with `cargo xtask ptx --update`",
                    TEST_KERNELS.committed_path(&root, builder.arch_name()).display()
                );
            }
            if let Err(e) = devcomm_build::write_if_changed(&out, &TEST_KERNELS.embedded(&ptx.render())) {
                panic!("devcomm-tests: {e}");
            }
        }
        Err(e) => panic!("devcomm-tests: no GPU kernels for the tests: {e}"),
    }
}
