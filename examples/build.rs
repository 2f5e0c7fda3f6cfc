//! Embeds the examples' kernels (`examples/kernels`) as PTX, the way a
//! project ships its own kernel crate: the committed `examples/ptx/` file
//! when it matches the sources (no nightly needed), else a build from source
//! with nightly + `rust-src` (`devcomm-build`), else an error that says what
//! to run. `src/lib.rs` includes the result as `EXAMPLE_PTX`.

use std::path::PathBuf;

use devcomm_build::committed::{self, Origin, EXAMPLE_KERNELS};

fn main() {
    for var in ["DEVCOMM_PTX_ARCH", "DEVCOMM_PTX_TOOLCHAIN"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    let manifest_dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let root = manifest_dir.parent().unwrap_or(&manifest_dir).to_path_buf();
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR")).join("devcomm_example_kernels.ptx");
    let mut builder = devcomm_build::PtxBuilder::new(EXAMPLE_KERNELS.package).manifest_dir(&root);
    if let Some(arch) = std::env::var("DEVCOMM_PTX_ARCH").ok().filter(|v| !v.is_empty()) {
        builder = builder.arch(arch);
    }
    if let Some(tc) = std::env::var("DEVCOMM_PTX_TOOLCHAIN").ok().filter(|v| !v.is_empty()) {
        builder = builder.toolchain(tc);
    }
    println!("cargo:rerun-if-changed={}", EXAMPLE_KERNELS.committed_path(&root, builder.arch_name()).display());
    for p in EXAMPLE_KERNELS.watched_paths(&root) {
        if p.exists() {
            println!("cargo:rerun-if-changed={}", p.display());
        }
    }
    match committed::resolve(&EXAMPLE_KERNELS, &root, &builder) {
        Ok((ptx, origin)) => {
            if origin != Origin::Committed {
                println!(
                    "cargo:warning=devcomm-examples: the committed example kernels are stale or missing; built them \
                     from source. Refresh with `cargo xtask ptx --update`"
                );
            }
            if let Err(e) = devcomm_build::write_if_changed(&out, &ptx.render()) {
                panic!("devcomm-examples: {e}");
            }
        }
        Err(e) => panic!("devcomm-examples: no GPU kernels for the examples: {e}"),
    }
}
