//! The PTX of devcomm's own kernels (`devcomm-kernels`).
//!
//! The PTX ships with the crate: it is committed under `host/ptx/` (made by
//! `cargo xtask ptx --update` with a nightly toolchain, with a hash of the
//! sources it came from), and `build.rs` embeds it, so an ordinary stable
//! build has working GPU kernels. When the kernel sources have changed since
//! it was made, `build.rs` rebuilds them from source (nightly + `rust-src`)
//! or fails saying what to run. Only `DEVCOMM_SKIP_PTX=1` builds the crate
//! without kernels (emulated runtime only). A PTX file can also be given at
//! run time through `DEVCOMM_PTX_PATH`.
//!
//! **Ahead-of-time images.** The CUDA driver compiles PTX when a module is
//! loaded: minutes for the library's and the test kernels' modules on a
//! fresh machine (343 s on 2 × H200). With `DEVCOMM_CUBIN_DIR` set, every
//! module the CUDA runtime loads (the library's, and any
//! [`Device::load_module`](crate::Device::load_module)'s) is looked up there
//! first as `<dir>/<sha256 of the PTX text>.cubin` — a `ptxas -arch=sm_90`
//! image of exactly that PTX (`cargo xtask cubin` makes them for every
//! committed PTX) — and loaded instead of the PTX when present. A missing
//! image means the PTX as before; an image the driver refuses (another
//! architecture) is logged and the PTX loaded instead. The hash in the name
//! keeps an image from ever standing in for other PTX.

use std::borrow::Cow;

use crate::Error;

/// The environment variable naming a PTX file to use instead of the embedded one.
pub const PTX_PATH_ENV: &str = "DEVCOMM_PTX_PATH";

/// The environment variable naming a folder of ahead-of-time compiled
/// kernel images (see the [module docs](self)).
pub const CUBIN_DIR_ENV: &str = "DEVCOMM_CUBIN_DIR";

/// The file name of `ptx`'s ahead-of-time image: `<sha256 hex>.cubin`.
pub fn cubin_name(ptx: &str) -> String {
    use sha2::{Digest, Sha256};
    let hex: String = Sha256::digest(ptx.as_bytes()).iter().map(|b| format!("{b:02x}")).collect();
    format!("{hex}.cubin")
}

/// The ahead-of-time image of `ptx` in `DEVCOMM_CUBIN_DIR`, if that is set
/// and holds one (its path and bytes).
///
/// # Errors
/// [`Error::CudaError`] when the image exists but cannot be read or is empty.
pub fn cubin_for(ptx: &str) -> Result<Option<(std::path::PathBuf, Vec<u8>)>, Error> {
    cubin_in(std::env::var_os(CUBIN_DIR_ENV).as_deref(), ptx)
}

/// [`cubin_for`] with the folder given (`None` or empty: no folder).
fn cubin_in(dir: Option<&std::ffi::OsStr>, ptx: &str) -> Result<Option<(std::path::PathBuf, Vec<u8>)>, Error> {
    let Some(dir) = dir.filter(|d| !d.is_empty()) else {
        return Ok(None);
    };
    let path = std::path::Path::new(dir).join(cubin_name(ptx));
    match std::fs::read(&path) {
        Ok(bytes) if !bytes.is_empty() => Ok(Some((path, bytes))),
        Ok(_) => Err(Error::CudaError(format!("the kernel image {} ({CUBIN_DIR_ENV}) is empty", path.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            tracing::debug!(path = %path.display(), "no ahead-of-time image of this PTX; the driver compiles it");
            Ok(None)
        }
        Err(e) => {
            Err(Error::CudaError(format!("cannot read the kernel image {} ({CUBIN_DIR_ENV}): {e}", path.display())))
        }
    }
}

/// What `build.rs` wrote: a marker line (`// devcomm-embedded-ptx
/// sha256:<hash of the rest>`, or `... none (why)`), then the PTX. The
/// marker is what `cargo xtask bundle` looks for in binaries.
static EMBEDDED: &str = include_str!(concat!(env!("OUT_DIR"), "/devcomm_kernels.ptx"));

/// The marker line and the PTX after it.
fn split_embedded() -> (&'static str, &'static str) {
    EMBEDDED.split_once('\n').unwrap_or((EMBEDDED, ""))
}

/// The kernels' PTX embedded at build time, or `None` when the crate was
/// built without it (`DEVCOMM_SKIP_PTX=1`).
pub fn embedded_kernels_ptx() -> Option<&'static str> {
    let (_, ptx) = split_embedded();
    if ptx.trim().is_empty() {
        None
    } else {
        Some(ptx)
    }
}

/// The label of the embedded PTX: `sha256:<hex>` of [`embedded_kernels_ptx`],
/// or `none (why)`.
pub fn embedded_kernels_label() -> &'static str {
    // Not written as one literal: `cargo xtask bundle` searches binaries for
    // the marker, and this function's text must not look like one.
    let (marker, _) = split_embedded();
    marker.splitn(3, ' ').nth(2).unwrap_or(marker)
}

/// The kernels' PTX to load: the file named by `DEVCOMM_PTX_PATH` if set,
/// else the embedded module.
///
/// # Errors
/// [`Error::CudaError`] when neither is available (or the file cannot be
/// read), with a message that says how to get one.
pub fn kernels_ptx() -> Result<Cow<'static, str>, Error> {
    if let Some(path) = std::env::var_os(PTX_PATH_ENV).filter(|p| !p.is_empty()) {
        let text = std::fs::read_to_string(&path).map_err(|e| {
            Error::CudaError(format!(
                "cannot read the PTX file {} named by {PTX_PATH_ENV}: {e}",
                std::path::Path::new(&path).display()
            ))
        })?;
        if text.trim().is_empty() {
            return Err(Error::CudaError(format!(
                "the PTX file {} named by {PTX_PATH_ENV} is empty",
                std::path::Path::new(&path).display()
            )));
        }
        return Ok(Cow::Owned(text));
    }
    embedded_kernels_ptx().map(Cow::Borrowed).ok_or_else(|| {
        Error::CudaError(
            "devcomm was built without its GPU kernels (DEVCOMM_SKIP_PTX was set at build time): \
             rebuild without DEVCOMM_SKIP_PTX, or set DEVCOMM_PTX_PATH to a PTX file of the kernels \
             (`cargo xtask ptx` writes one to target/ptx/devcomm_kernels.ptx)"
                .into(),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cubin_names_are_the_ptx_hash() {
        // sha256("") and sha256("abc"): the image of other PTX never matches.
        assert_eq!(cubin_name(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855.cubin");
        assert_eq!(cubin_name("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad.cubin");
    }

    #[test]
    fn cubin_names_match_what_xtask_cubin_writes() {
        // `cargo xtask cubin` names images by `devcomm_build`'s label of
        // the committed PTX; the runtime must look for the same name.
        for text in ["", "abc", "// ptx\n.version 8.4\n"] {
            let label = devcomm_build::committed::sha256_label(text);
            assert_eq!(cubin_name(text), format!("{}.cubin", label.strip_prefix("sha256:").unwrap()));
        }
    }

    #[test]
    fn cubin_lookup() {
        let dir = std::env::temp_dir().join(format!("devcomm-cubin-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(cubin_name("ptx a")), b"\x7fELF image").unwrap();
        std::fs::write(dir.join(cubin_name("ptx empty")), b"").unwrap();
        let d = Some(dir.as_os_str());
        let (path, bytes) = cubin_in(d, "ptx a").unwrap().unwrap();
        assert_eq!((path, bytes), (dir.join(cubin_name("ptx a")), b"\x7fELF image".to_vec()));
        assert!(cubin_in(d, "ptx b").unwrap().is_none(), "an image of other PTX was used");
        assert!(matches!(cubin_in(d, "ptx empty"), Err(Error::CudaError(m)) if m.contains("empty")));
        assert!(cubin_in(Some(std::ffi::OsStr::new("")), "ptx a").unwrap().is_none(), "an empty variable is unset");
        assert!(cubin_in(None, "ptx a").unwrap().is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[cfg(not(devcomm_no_ptx))]
    #[test]
    fn embedded_ptx_has_the_library_kernels() {
        let ptx = embedded_kernels_ptx().expect("PTX is embedded unless cfg(devcomm_no_ptx)");
        let entries = devcomm_build::check_ptx(ptx).expect("embedded PTX is loadable");
        for k in ["axpy_f32", "block_sum_u64"] {
            assert!(entries.iter().any(|e| e == k), "no entry {k} in {entries:?}");
        }
        assert!(ptx.contains(".target sm_"));
        let label = embedded_kernels_label();
        assert_eq!(label, devcomm_build::committed::sha256_label(ptx), "the marker names the PTX after it");
    }

    #[cfg(devcomm_no_ptx)]
    #[test]
    fn no_embedded_ptx() {
        assert!(embedded_kernels_ptx().is_none());
    }

    #[test]
    fn kernels_ptx_matches_embedded_when_no_override() {
        if std::env::var_os(PTX_PATH_ENV).is_some() {
            return;
        }
        match (kernels_ptx(), embedded_kernels_ptx()) {
            (Ok(p), Some(e)) => assert_eq!(p, e),
            (Err(Error::CudaError(m)), None) => assert!(m.contains("DEVCOMM_SKIP_PTX")),
            (r, e) => panic!("kernels_ptx {r:?} vs embedded {:?}", e.map(str::len)),
        }
    }
}
