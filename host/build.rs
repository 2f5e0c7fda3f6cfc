//! Builds `devcomm-kernels` to PTX (through `devcomm-build`) and leaves it in
//! `$OUT_DIR/devcomm_kernels.ptx`, where `src/ptx.rs` embeds it.
//!
//! A missing nightly toolchain or `rust-src` does not fail the build: the PTX
//! file is left empty, a warning says why, and `cfg(devcomm_no_ptx)` is set.
//! Set `DEVCOMM_SKIP_PTX=1` to skip the PTX build on purpose. Other knobs:
//! `DEVCOMM_PTX_ARCH` (default `sm_90`), `DEVCOMM_PTX_TOOLCHAIN` (default
//! `nightly`), `DEVCOMM_PTX_TARGET_DIR`.

use std::env;
use std::path::{Path, PathBuf};

const PTX_FILE: &str = "devcomm_kernels.ptx";

fn main() {
    println!("cargo::rustc-check-cfg=cfg(devcomm_no_ptx)");
    for var in ["DEVCOMM_SKIP_PTX", "DEVCOMM_PTX_ARCH", "DEVCOMM_PTX_TOOLCHAIN", "DEVCOMM_PTX_TARGET_DIR"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    let manifest_dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR"));
    let out = out_dir.join(PTX_FILE);
    let workspace = manifest_dir.parent().unwrap_or(&manifest_dir).to_path_buf();
    let device = workspace.join("device");
    let kernels = device.join("kernels");
    for p in [
        device.join("src"),
        device.join("Cargo.toml"),
        kernels.join("src"),
        kernels.join("Cargo.toml"),
        workspace.join("Cargo.toml"),
    ] {
        println!("cargo:rerun-if-changed={}", p.display());
    }

    if env::var("DEVCOMM_SKIP_PTX").is_ok_and(|v| !v.is_empty() && v != "0") {
        no_ptx(&out, "DEVCOMM_SKIP_PTX is set");
        return;
    }
    if env::var_os("DOCS_RS").is_some() {
        no_ptx(&out, "building documentation on docs.rs");
        return;
    }
    if !kernels.join("Cargo.toml").is_file() {
        no_ptx(&out, &format!("the kernel sources are not at {}", kernels.display()));
        return;
    }

    let mut builder = devcomm_build::PtxBuilder::new("devcomm-kernels").manifest_dir(&workspace);
    if let Some(arch) = non_empty_env("DEVCOMM_PTX_ARCH") {
        builder = builder.arch(arch);
    }
    if let Some(tc) = non_empty_env("DEVCOMM_PTX_TOOLCHAIN") {
        builder = builder.toolchain(tc);
    }
    match builder.build() {
        Ok(ptx) => {
            if let Err(e) = ptx.copy_to(&out) {
                panic!("devcomm: {e}");
            }
        }
        Err(e) if e.is_toolchain_missing() => no_ptx(&out, &e.to_string()),
        Err(e) => panic!("devcomm: building the kernels to PTX failed: {e}"),
    }
}

fn non_empty_env(name: &str) -> Option<String> {
    env::var(name).ok().filter(|v| !v.is_empty())
}

/// Leaves an empty PTX file, says why, and sets `cfg(devcomm_no_ptx)`.
fn no_ptx(out: &Path, why: &str) {
    println!(
        "cargo:warning=devcomm is built without GPU kernels (PTX): {why}; the emulated runtime \
         works, CUDA needs DEVCOMM_PTX_PATH or a rebuild with the nightly toolchain"
    );
    println!("cargo:rustc-cfg=devcomm_no_ptx");
    if let Err(e) = devcomm_build::write_if_changed(out, "") {
        panic!("devcomm: {e}");
    }
}
