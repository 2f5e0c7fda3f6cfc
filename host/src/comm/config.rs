//! [`Config`]: how a communicator is created.

use crate::error::{Error, Result};
use crate::runtime::Device;
use std::time::Duration;

/// Environment variable: bound on bootstrap rendezvous, in milliseconds (default 30000).
pub const BOOTSTRAP_TIMEOUT_ENV: &str = "DEVCOMM_BOOTSTRAP_TIMEOUT_MS";
/// Environment variable: bound on each host-side bootstrap operation, in milliseconds (default 300000).
pub const OP_TIMEOUT_ENV: &str = "DEVCOMM_OP_TIMEOUT_MS";
/// Environment variable: `0` makes communicator creation non-blocking (default `1`), as `NCCL_COMM_BLOCKING`.
pub const BLOCKING_ENV: &str = "DEVCOMM_COMM_BLOCKING";

/// Default of [`Config::bootstrap_timeout`].
pub const DEFAULT_BOOTSTRAP_TIMEOUT: Duration = Duration::from_secs(30);
/// Default of [`Config::op_timeout`].
pub const DEFAULT_OP_TIMEOUT: Duration = Duration::from_secs(300);

/// How a communicator is created (`ncclConfig_t`'s counterpart).
///
/// [`Config::default`] uses the built-in defaults; [`Config::from_env`]
/// applies the `DEVCOMM_*` environment variables on top.
///
/// ```
/// use devcomm::comm::Config;
/// use std::time::Duration;
/// let cfg = Config::default().with_bootstrap_timeout(Duration::from_secs(5)).with_blocking(false);
/// assert!(!cfg.blocking);
/// ```
#[doc(alias = "ncclConfig_t")]
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Config {
    /// Bound on connecting to the root and waiting for every rank to join.
    pub bootstrap_timeout: Duration,
    /// Bound on each later bootstrap operation (allgather, barrier, broadcast, finalize).
    pub op_timeout: Duration,
    /// `true`: creation returns once the communicator is ready. `false`:
    /// creation returns at once and the rendezvous runs on a thread;
    /// [`Communicator::get_async_error`](super::Communicator::get_async_error)
    /// reports [`Error::InProgress`] until it is done.
    pub blocking: bool,
    /// The device this rank drives. `None`: the runtime of `DEVCOMM_RUNTIME`,
    /// ordinal `LOCAL_RANK` (else the rank) modulo the number of devices.
    pub device: Option<Device>,
    /// Force a GIN backend (`None`: `DEVCOMM_GIN_TYPE`, else automatic).
    pub gin_type: Option<crate::gin::GinType>,
    /// Force the proxy backend's transport (`None`: `DEVCOMM_GIN_TRANSPORT`,
    /// else [`GinTransport::Auto`](crate::gin::GinTransport)).
    pub gin_transport: Option<crate::gin::GinTransport>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            bootstrap_timeout: DEFAULT_BOOTSTRAP_TIMEOUT,
            op_timeout: DEFAULT_OP_TIMEOUT,
            blocking: true,
            device: None,
            gin_type: None,
            gin_transport: None,
        }
    }
}

impl Config {
    /// The defaults, overridden by [`BOOTSTRAP_TIMEOUT_ENV`], [`OP_TIMEOUT_ENV`] and [`BLOCKING_ENV`].
    ///
    /// Errors: [`Error::InvalidArgument`] when a variable is set to something unparsable.
    pub fn from_env() -> Result<Config> {
        Config::from_lookup(|k| std::env::var(k).ok())
    }

    /// As [`Config::from_env`], reading variables through `get`.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Config> {
        let mut c = Config::default();
        if let Some(ms) = env_millis(&get, BOOTSTRAP_TIMEOUT_ENV)? {
            c.bootstrap_timeout = ms;
        }
        if let Some(ms) = env_millis(&get, OP_TIMEOUT_ENV)? {
            c.op_timeout = ms;
        }
        if let Some(v) = get(BLOCKING_ENV) {
            c.blocking = match v.trim().to_ascii_lowercase().as_str() {
                "1" | "true" | "yes" | "on" | "" => true,
                "0" | "false" | "no" | "off" => false,
                other => return Err(Error::invalid_argument(format!("{BLOCKING_ENV}={other:?}: expected 0 or 1"))),
            };
        }
        Ok(c)
    }

    /// Sets [`Config::bootstrap_timeout`].
    pub fn with_bootstrap_timeout(mut self, t: Duration) -> Self {
        self.bootstrap_timeout = t;
        self
    }

    /// Sets [`Config::op_timeout`].
    pub fn with_op_timeout(mut self, t: Duration) -> Self {
        self.op_timeout = t;
        self
    }

    /// Sets both timeouts.
    pub fn with_timeouts(self, t: Duration) -> Self {
        self.with_bootstrap_timeout(t).with_op_timeout(t)
    }

    /// Sets [`Config::blocking`].
    pub fn with_blocking(mut self, blocking: bool) -> Self {
        self.blocking = blocking;
        self
    }

    /// Sets [`Config::device`].
    pub fn with_device(mut self, device: Device) -> Self {
        self.device = Some(device);
        self
    }

    /// The same config forcing GIN backend `t`.
    pub fn with_gin_type(mut self, t: crate::gin::GinType) -> Self {
        self.gin_type = Some(t);
        self
    }

    /// The same config forcing the proxy backend's transport `t`.
    pub fn with_gin_transport(mut self, t: crate::gin::GinTransport) -> Self {
        self.gin_transport = Some(t);
        self
    }

    pub(crate) fn validate(&self) -> Result<()> {
        if self.bootstrap_timeout.is_zero() || self.op_timeout.is_zero() {
            return Err(Error::invalid_argument("communicator timeouts must be positive"));
        }
        Ok(())
    }
}

fn env_millis(get: &impl Fn(&str) -> Option<String>, var: &str) -> Result<Option<Duration>> {
    let Some(v) = get(var) else { return Ok(None) };
    match v.trim().parse::<u64>() {
        Ok(ms) if ms > 0 => Ok(Some(Duration::from_millis(ms))),
        _ => Err(Error::invalid_argument(format!("{var}={v:?}: expected a positive number of milliseconds"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_overrides() {
        let c = Config::from_lookup(|k| match k {
            BOOTSTRAP_TIMEOUT_ENV => Some("1500".into()),
            BLOCKING_ENV => Some("0".into()),
            _ => None,
        })
        .unwrap();
        assert_eq!(c.bootstrap_timeout, Duration::from_millis(1500));
        assert_eq!(c.op_timeout, DEFAULT_OP_TIMEOUT);
        assert!(!c.blocking);
        assert!(Config::from_lookup(|_| None).unwrap().blocking);
        let bad = Config::from_lookup(|k| (k == OP_TIMEOUT_ENV).then(|| "soon".to_string()));
        assert!(matches!(bad, Err(Error::InvalidArgument(_))));
        let bad = Config::from_lookup(|k| (k == BLOCKING_ENV).then(|| "maybe".to_string()));
        assert!(matches!(bad, Err(Error::InvalidArgument(_))));
    }
}
