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

use std::borrow::Cow;

use crate::Error;

/// The environment variable naming a PTX file to use instead of the embedded one.
pub const PTX_PATH_ENV: &str = "DEVCOMM_PTX_PATH";

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
