//! Per-communicator state of windows and device communicators: the
//! registration sequence, which allocation regions are registered, the LSA
//! layout cache, and the abort sinks (device-visible flags to raise on abort).

use crate::error::Result;
use crate::runtime::HostMappedWord;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

/// One registered region: (allocation id, start, end, window id).
pub(crate) type Region = (u64, usize, usize, u32);

/// What a [`Communicator`](crate::comm::Communicator) keeps for windows and device communicators.
pub(crate) struct CommExt {
    /// Number of collective registrations so far (names the fd-passing sockets).
    pub(crate) reg_seq: AtomicU64,
    /// Next window id.
    pub(crate) next_window_id: AtomicU32,
    /// Registered regions, shared with the windows so a released one removes itself.
    pub(crate) regions: Arc<Mutex<Vec<Region>>>,
    /// The topology's LSA size (cached once known).
    pub(crate) topo_lsa: Mutex<Option<Result<usize>>>,
    /// Set when a registration found LSA peers that cannot access each other.
    pub(crate) p2p_fallback: AtomicBool,
    /// Whether this rank's device can access every LSA peer's (cached).
    pub(crate) p2p_ok: Mutex<Option<bool>>,
    /// Device-visible abort flags of live device communicators.
    pub(crate) abort_sinks: Arc<AbortSinks>,
    /// Window id → (this rank's address of the window, usable size): what
    /// the GIN proxy resolves descriptors' window ids with.
    pub(crate) window_table: Arc<Mutex<std::collections::HashMap<u32, (u64, u64)>>>,
    /// GIN proxy errors for [`Communicator::get_async_error`](crate::comm::Communicator::get_async_error).
    pub(crate) gin_errors: crate::gin::resources::GinErrors,
}

impl CommExt {
    pub(crate) fn new(abort_flag: Arc<AtomicBool>) -> CommExt {
        CommExt {
            reg_seq: AtomicU64::new(0),
            next_window_id: AtomicU32::new(0),
            regions: Arc::new(Mutex::new(Vec::new())),
            topo_lsa: Mutex::new(None),
            p2p_fallback: AtomicBool::new(false),
            p2p_ok: Mutex::new(None),
            abort_sinks: Arc::new(AbortSinks {
                abort_flag,
                words: Mutex::new(Vec::new()),
                watcher: AtomicBool::new(false),
            }),
            window_table: Arc::new(Mutex::new(std::collections::HashMap::new())),
            gin_errors: Default::default(),
        }
    }
}

/// The abort hook: device-visible words set to 1 when the communicator's
/// abort flag is raised (local abort: at once, from
/// [`Communicator::abort`](crate::comm::Communicator::abort); remote failure:
/// by a watcher thread that polls the flag every millisecond while device
/// communicators live).
pub(crate) struct AbortSinks {
    abort_flag: Arc<AtomicBool>,
    words: Mutex<Vec<Weak<HostMappedWord>>>,
    watcher: AtomicBool,
}

const WATCH_PERIOD: Duration = Duration::from_millis(1);

impl AbortSinks {
    /// Sets every live word to 1.
    pub(crate) fn fire(&self) {
        let mut words = self.words.lock().unwrap_or_else(|p| p.into_inner());
        words.retain(|w| match w.upgrade() {
            Some(w) => {
                w.set(1);
                true
            }
            None => false,
        });
    }

    /// Adds `word` (set at once if the flag is already up) and makes sure a
    /// watcher runs.
    pub(crate) fn add(self: &Arc<Self>, word: &Arc<HostMappedWord>) {
        self.words.lock().unwrap_or_else(|p| p.into_inner()).push(Arc::downgrade(word));
        if self.abort_flag.load(Ordering::SeqCst) {
            word.set(1);
        }
        if !self.watcher.swap(true, Ordering::SeqCst) {
            let me = Arc::downgrade(self);
            let spawned = std::thread::Builder::new().name("devcomm-abort-watch".into()).spawn(move || watch(me));
            if let Err(e) = spawned {
                self.watcher.store(false, Ordering::SeqCst);
                tracing::warn!("could not start the abort watcher ({e}): remote failures reach kernels late");
            }
        }
    }
}

/// Polls the abort flag while there are live words; fires once it is up.
fn watch(sinks: Weak<AbortSinks>) {
    loop {
        let Some(s) = sinks.upgrade() else { return };
        if s.abort_flag.load(Ordering::SeqCst) {
            s.fire();
        }
        {
            let mut words = s.words.lock().unwrap_or_else(|p| p.into_inner());
            words.retain(|w| w.strong_count() > 0);
            if words.is_empty() {
                // Nothing to watch: stop; `add` starts a new watcher.
                s.watcher.store(false, Ordering::SeqCst);
                return;
            }
        }
        drop(s);
        std::thread::sleep(WATCH_PERIOD);
    }
}
