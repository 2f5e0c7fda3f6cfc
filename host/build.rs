//! Chooses the PTX of devcomm's own kernels (`devcomm-kernels`) and leaves it
//! in `$OUT_DIR/devcomm_kernels.ptx`, where `src/ptx.rs` embeds it.
//!
//! The PTX is committed under `ptx/` (one file per architecture, made by
//! `cargo xtask ptx --update`), with a hash of the sources it was built from.
//! When that hash matches the tree, the committed file is embedded: no
//! nightly toolchain is needed. When it does not (someone changed a kernel
//! and has not refreshed it), the kernels are rebuilt from source with the
//! nightly toolchain and `rust-src`, with a warning; without them the build
//! fails saying what to run. A build never ends silently without kernels.
//!
//! The embedded file starts with a marker line, `// devcomm-embedded-ptx
//! sha256:<hash of the PTX>` (or `none` with `DEVCOMM_SKIP_PTX=1`), by which
//! `cargo xtask bundle` checks what a binary carries.
//!
//! Knobs: `DEVCOMM_SKIP_PTX=1` (no kernels on purpose: emulated runtime only),
//! `DEVCOMM_PTX_ARCH` (default `sm_90`), `DEVCOMM_PTX_TOOLCHAIN` (default
//! `nightly`), `DEVCOMM_PTX_TARGET_DIR`.

use std::env;
use std::path::{Path, PathBuf};

use devcomm_build::committed::{self, Origin, LIBRARY_KERNELS};

const PTX_FILE: &str = "devcomm_kernels.ptx";
const MARKER: &str = "// devcomm-embedded-ptx";

fn main() {
    println!("cargo::rustc-check-cfg=cfg(devcomm_no_ptx)");
    for var in ["DEVCOMM_SKIP_PTX", "DEVCOMM_PTX_ARCH", "DEVCOMM_PTX_TOOLCHAIN", "DEVCOMM_PTX_TARGET_DIR"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    let manifest_dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR")).join(PTX_FILE);
    let workspace = manifest_dir.parent().unwrap_or(&manifest_dir).to_path_buf();

    if env::var("DEVCOMM_SKIP_PTX").is_ok_and(|v| !v.is_empty() && v != "0") {
        println!(
            "cargo:warning=devcomm is built without GPU kernels (PTX) because DEVCOMM_SKIP_PTX is set: \
             only the emulated runtime can launch its kernels"
        );
        println!("cargo:rustc-cfg=devcomm_no_ptx");
        write(&out, &format!("{MARKER} none (DEVCOMM_SKIP_PTX)\n"));
        return;
    }

    let mut builder = devcomm_build::PtxBuilder::new(LIBRARY_KERNELS.package).manifest_dir(&workspace);
    if let Some(arch) = non_empty_env("DEVCOMM_PTX_ARCH") {
        builder = builder.arch(arch);
    }
    if let Some(tc) = non_empty_env("DEVCOMM_PTX_TOOLCHAIN") {
        builder = builder.toolchain(tc);
    }
    if !LIBRARY_KERNELS.present_in(&workspace) {
        // A packaged crate: the committed PTX ships in `ptx/`, without the
        // kernel sources to compare it with.
        let path = manifest_dir.join("ptx").join(format!("{}.{}.ptx", LIBRARY_KERNELS.file_stem, builder.arch_name()));
        println!("cargo:rerun-if-changed={}", path.display());
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!("devcomm: no GPU kernels for {}: cannot read {}: {e}", builder.arch_name(), path.display())
        });
        write(&out, &format!("{MARKER} {}\n{text}", committed::sha256_label(&text)));
        return;
    }
    let root = workspace;
    println!("cargo:rerun-if-changed={}", LIBRARY_KERNELS.committed_path(&root, builder.arch_name()).display());
    for p in LIBRARY_KERNELS.watched_paths(&root) {
        if p.exists() {
            println!("cargo:rerun-if-changed={}", p.display());
        }
    }

    match committed::resolve(&LIBRARY_KERNELS, &root, &builder) {
        Ok((ptx, origin)) => {
            let path = LIBRARY_KERNELS.committed_path(&root, builder.arch_name());
            match origin {
                Origin::Committed => {}
                Origin::RebuiltStale => println!(
                    "cargo:warning=devcomm: {} is stale (the kernel sources changed since it was generated); \
                     built the kernels from source instead. Refresh it with `cargo xtask ptx --update`",
                    path.display()
                ),
                Origin::RebuiltMissing => println!(
                    "cargo:warning=devcomm: no committed PTX for {} ({}); built the kernels from source",
                    builder.arch_name(),
                    path.display()
                ),
            }
            let text = ptx.render();
            write(&out, &format!("{MARKER} {}\n{text}", committed::sha256_label(&text)));
        }
        Err(e) => {
            if let Some(src) = rust_src_dir(&builder) {
                // Installing rust-src is enough to make the next build try again.
                println!("cargo:rerun-if-changed={}", src.display());
            }
            panic!("devcomm: no GPU kernels for this build: {e}");
        }
    }
}

/// Where the toolchain's `rust-src` lives (present or not), to be watched
/// (or, when the toolchain itself is missing, where toolchains are installed).
fn rust_src_dir(builder: &devcomm_build::PtxBuilder) -> Option<PathBuf> {
    builder.sysroot().ok().map(|s| s.join("lib/rustlib/src")).or_else(|| {
        let home = env::var_os("RUSTUP_HOME")
            .map(PathBuf::from)
            .or_else(|| env::var_os("HOME").map(|h| Path::new(&h).join(".rustup")))?;
        Some(home.join("toolchains"))
    })
}

fn non_empty_env(name: &str) -> Option<String> {
    env::var(name).ok().filter(|v| !v.is_empty())
}

fn write(out: &Path, text: &str) {
    if let Err(e) = devcomm_build::write_if_changed(out, text) {
        panic!("devcomm: {e}");
    }
}
