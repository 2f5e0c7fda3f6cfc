//! The PTX of devcomm's own kernels (`devcomm-kernels`).
//!
//! `build.rs` compiles the kernels to PTX on every build of this crate and
//! embeds the result. When that was impossible (no nightly toolchain or no
//! `rust-src`, or `DEVCOMM_SKIP_PTX=1`), the embedded module is empty and a
//! PTX file can still be supplied at run time through `DEVCOMM_PTX_PATH`.

use std::borrow::Cow;

use crate::Error;

/// The environment variable naming a PTX file to use instead of the embedded one.
pub const PTX_PATH_ENV: &str = "DEVCOMM_PTX_PATH";

static EMBEDDED: &str = include_str!(concat!(env!("OUT_DIR"), "/devcomm_kernels.ptx"));

/// The kernels' PTX embedded at build time, or `None` when the crate was
/// built without it.
pub fn embedded_kernels_ptx() -> Option<&'static str> {
    if EMBEDDED.trim().is_empty() {
        None
    } else {
        Some(EMBEDDED)
    }
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
            "devcomm was built without its PTX (the nightly toolchain or its rust-src component \
             was missing, or DEVCOMM_SKIP_PTX was set): run \
             `rustup toolchain install nightly --component rust-src` and rebuild, or build it \
             with `cargo xtask ptx` and set DEVCOMM_PTX_PATH=target/ptx/devcomm_kernels.ptx"
                .into(),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(not(devcomm_no_ptx))]
    #[test]
    fn embedded_ptx_has_selftest_kernels() {
        let ptx = embedded_kernels_ptx().expect("PTX is embedded unless cfg(devcomm_no_ptx)");
        let entries = devcomm_build::check_ptx(ptx).expect("embedded PTX is loadable");
        for k in ["axpy_f32", "block_sum_u64"] {
            assert!(entries.iter().any(|e| e == k), "no entry {k} in {entries:?}");
        }
        assert!(ptx.contains(".target sm_"));
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
            (Err(Error::CudaError(m)), None) => assert!(m.contains("rustup toolchain install")),
            (r, e) => panic!("kernels_ptx {r:?} vs embedded {:?}", e.map(str::len)),
        }
    }
}
