//! The GIN proxy over the RDMA Verbs transport (cargo feature `verbs`,
//! `DEVCOMM_GIN_TRANSPORT=verbs`): this rank's memory as the NIC registers
//! it, and the collective connection.
//!
//! Registered memory: the windows the device communicator declared with
//! `use_window` (addresses and sizes from the communicator's window table)
//! and the signal array. GPU windows need GPUDirect RDMA: each window's
//! allocation is exported as a dmabuf (`cuMemGetHandleForAddressRange`) and
//! registered through it (`ibv_reg_dmabuf_mr`); where the driver gives no
//! dmabuf (or [`GIN_IB_DMABUF_ENV`] is `0`), the address is registered with
//! `ibv_reg_mr`, which works for host memory (the emulated runtime's
//! windows) and for GPU memory where `nvidia-peermem` is loaded.
//!
//! Untested against a real NIC: none exists on the project's machines.
//! Without one, connecting fails on every rank with an error naming the cause.

use super::resources::{from_gin, CommBootstrap};
use crate::comm::Communicator;
use crate::dev_comm::DevCommRequirements;
use crate::error::{Error, Result};
use crate::gin::GIN_IB_DMABUF_ENV;
use crate::runtime::SharedHostBuffer;
use crate::window::agree;
use devcomm_gin::transport::verbs::{Dmabuf, VerbsConfig, VerbsMemory, VerbsTransport, VerbsWindow};
use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd};

/// A window to register: its id and the allocation it lies in (what a
/// dmabuf is exported of; its base and size are multiples of the
/// allocation granularity, so page-aligned as the driver wants).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct WindowSpan {
    pub(super) id: u32,
    pub(super) alloc_base: u64,
    pub(super) alloc_len: u64,
}

/// This rank's memory for [`VerbsTransport::connect`], and the dmabufs its
/// windows name (open while this value lives: only `connect` needs them,
/// the registrations keep their own references).
pub(super) struct VerbsSetup {
    pub(super) mem: VerbsMemory,
    dmabufs: Vec<OwnedFd>,
}

impl VerbsSetup {
    /// How many dmabufs the windows are registered through.
    pub(super) fn dmabufs(&self) -> usize {
        self.dmabufs.len()
    }
}

/// Builds the transport's memory: each of `spans`' windows at its address
/// and size in `table` (window id → (address, bytes)), through a dmabuf of
/// its allocation when `export(alloc_base, alloc_len)` gives one (one per
/// allocation, shared by the windows in it); the signal array
/// `total_signals` words at `signals`.
///
/// Errors: [`Error::InternalError`] for a window missing from the table or
/// lying outside its allocation.
pub(super) fn verbs_memory(
    table: &HashMap<u32, (u64, u64)>,
    spans: &[WindowSpan],
    signals: *mut u64,
    total_signals: u32,
    mut export: impl FnMut(u64, u64) -> Option<OwnedFd>,
) -> Result<VerbsSetup> {
    let mut dmabufs: Vec<OwnedFd> = Vec::new();
    // Allocation base → index in `dmabufs` (None: exported nothing).
    let mut exported: HashMap<u64, Option<usize>> = HashMap::new();
    let mut windows = Vec::with_capacity(spans.len());
    for s in spans {
        let &(addr, len) = table.get(&s.id).ok_or_else(|| {
            Error::internal(format!("window {} declared with use_window is not in the window table", s.id))
        })?;
        let inside = addr >= s.alloc_base
            && addr.checked_add(len).zip(s.alloc_base.checked_add(s.alloc_len)).is_some_and(|(end, a)| end <= a);
        if !inside {
            return Err(Error::internal(format!(
                "window {} ({len} bytes at {addr:#x}) is not inside its allocation ({} bytes at {:#x})",
                s.id, s.alloc_len, s.alloc_base
            )));
        }
        let dmabuf = if len == 0 {
            None
        } else {
            let slot = *exported.entry(s.alloc_base).or_insert_with(|| {
                export(s.alloc_base, s.alloc_len).map(|fd| {
                    dmabufs.push(fd);
                    dmabufs.len() - 1
                })
            });
            slot.map(|i| Dmabuf { fd: dmabufs[i].as_raw_fd(), offset: addr - s.alloc_base })
        };
        windows.push(VerbsWindow { id: s.id, addr, len, dmabuf });
    }
    Ok(VerbsSetup { mem: VerbsMemory { windows, signals, total_signals }, dmabufs })
}

/// Whether windows may be exported as dmabufs ([`GIN_IB_DMABUF_ENV`]).
fn dmabuf_enabled() -> Result<bool> {
    match std::env::var(GIN_IB_DMABUF_ENV).as_deref().map(str::trim) {
        Err(_) | Ok("") | Ok("1") => Ok(true),
        Ok("0") => Ok(false),
        Ok(other) => Err(Error::invalid_argument(format!("{GIN_IB_DMABUF_ENV}={other:?}: expected 0 or 1"))),
    }
}

/// This rank's memory and settings (local: no other rank is involved).
fn prepare(
    comm: &Communicator,
    req: &DevCommRequirements,
    signals: &SharedHostBuffer,
    total_signals: u32,
) -> Result<(VerbsSetup, VerbsConfig)> {
    let config = VerbsConfig::from_env().map_err(from_gin)?;
    let use_dmabuf = dmabuf_enabled()?;
    let spans: Vec<WindowSpan> = req
        .live_windows()?
        .iter()
        .map(|w| WindowSpan { id: w.desc.id(), alloc_base: w.alloc().addr(), alloc_len: w.alloc().size() as u64 })
        .collect();
    let table = comm.ext.window_table.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let dev = comm.device();
    let setup = verbs_memory(&table, &spans, signals.host_ptr() as *mut u64, total_signals, |base, len| {
        if !use_dmabuf {
            return None;
        }
        match dev.export_dmabuf(base, len) {
            Ok(fd) => fd,
            Err(e) => {
                tracing::info!(
                    "GIN verbs: no dmabuf for the allocation at {base:#x} ({e}); registering its address \
                     (GPU memory then needs nvidia-peermem)"
                );
                None
            }
        }
    })?;
    Ok((setup, config))
}

/// Connects the verbs transport to every rank (itself included). Collective:
/// every rank first agrees that it could prepare its memory, then takes part
/// in both of [`VerbsTransport::connect`]'s exchanges, so a rank without an
/// RDMA device makes every rank return an error rather than wait.
///
/// The transport must be dropped before the windows `req` declared and
/// before `signals` (as `GinResources` and `DevCommHandle` order it).
pub(super) fn connect(
    comm: &Communicator,
    req: &DevCommRequirements,
    signals: &SharedHostBuffer,
    total_signals: u32,
) -> Result<VerbsTransport> {
    let prepared = prepare(comm, req, signals, total_signals);
    agree(comm, "create_dev_comm (GIN verbs memory)", prepared.as_ref().map(|_| ()).map_err(Clone::clone))?;
    let (setup, config) = prepared?;
    tracing::debug!(
        rank = comm.rank(),
        windows = setup.mem.windows.len(),
        dmabufs = setup.dmabufs(),
        "GIN verbs: connecting"
    );
    // SAFETY: the windows are ones `req` declared with use_window: the
    // device communicator holds them (their mappings stay) until its GIN
    // resources, which own the transport through the proxy, are dropped
    // (`DevCommHandle`'s drop stops GIN first). The signal array is
    // `total_signals` aligned u64s of `signals`, which `GinResources` keeps
    // until after the proxy (field order); the proxy, the host API and the
    // kernels access its words atomically. Every dmabuf fd is owned by
    // `setup`, open for the whole call.
    let transport = unsafe { VerbsTransport::connect(&CommBootstrap(comm), &setup.mem, &config) };
    drop(setup);
    transport.map_err(from_gin).map_err(|e| e.context("the GIN verbs transport could not connect"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_dmabuf() -> OwnedFd {
        std::fs::File::open("/dev/null").unwrap().into()
    }

    #[test]
    fn windows_come_from_the_table_with_one_dmabuf_per_allocation() {
        let table: HashMap<u32, (u64, u64)> =
            [(1, (0x20_0000, 100_003)), (2, (0x20_0000 + 0x1_9000, 4096)), (3, (0x60_0000, 0)), (7, (0x80_0000, 8))]
                .into_iter()
                .collect();
        let spans = [
            WindowSpan { id: 1, alloc_base: 0x20_0000, alloc_len: 0x20_0000 },
            WindowSpan { id: 2, alloc_base: 0x20_0000, alloc_len: 0x20_0000 },
            WindowSpan { id: 3, alloc_base: 0x60_0000, alloc_len: 0x20_0000 },
        ];
        let mut signals = [0u64; 5];
        let mut asked = Vec::new();
        let s = verbs_memory(&table, &spans, signals.as_mut_ptr(), 5, |b, l| {
            asked.push((b, l));
            Some(fake_dmabuf())
        })
        .unwrap();
        // One export for the allocation holding windows 1 and 2; none for the empty window.
        assert_eq!(asked, vec![(0x20_0000, 0x20_0000)]);
        assert_eq!(s.dmabufs(), 1);
        let w = &s.mem.windows;
        assert_eq!(w.len(), 3);
        assert_eq!((w[0].id, w[0].addr, w[0].len), (1, 0x20_0000, 100_003));
        assert_eq!(w[0].dmabuf.map(|d| d.offset), Some(0));
        assert_eq!((w[1].id, w[1].addr, w[1].len), (2, 0x21_9000, 4096));
        assert_eq!(w[1].dmabuf.map(|d| d.offset), Some(0x1_9000));
        assert_eq!(w[0].dmabuf.map(|d| d.fd), w[1].dmabuf.map(|d| d.fd));
        assert_eq!((w[2].id, w[2].len, w[2].dmabuf), (3, 0, None));
        assert_eq!((s.mem.signals, s.mem.total_signals), (signals.as_mut_ptr(), 5));
    }

    #[test]
    fn without_a_dmabuf_windows_are_registered_by_address() {
        let table: HashMap<u32, (u64, u64)> = [(4, (0x7f00_0000_1000, 8192))].into_iter().collect();
        let spans = [WindowSpan { id: 4, alloc_base: 0x7f00_0000_0000, alloc_len: 0x20_0000 }];
        let mut calls = 0;
        let s = verbs_memory(&table, &spans, std::ptr::null_mut(), 0, |_, _| {
            calls += 1;
            None
        })
        .unwrap();
        assert_eq!(calls, 1);
        assert_eq!(s.dmabufs(), 0);
        assert_eq!(s.mem.windows, vec![VerbsWindow { id: 4, addr: 0x7f00_0000_1000, len: 8192, dmabuf: None }]);
    }

    #[test]
    fn a_window_missing_or_outside_its_allocation_is_an_error() {
        let table: HashMap<u32, (u64, u64)> = [(1, (0x1000, 0x2000))].into_iter().collect();
        let none = |_: u64, _: u64| None;
        let missing = [WindowSpan { id: 2, alloc_base: 0, alloc_len: 1 << 20 }];
        let e = verbs_memory(&table, &missing, std::ptr::null_mut(), 0, none).err().unwrap();
        assert!(matches!(e, Error::InternalError(ref m) if m.contains("window 2")), "{e}");
        let outside = [WindowSpan { id: 1, alloc_base: 0x2000, alloc_len: 1 << 20 }];
        assert!(matches!(verbs_memory(&table, &outside, std::ptr::null_mut(), 0, none), Err(Error::InternalError(_))));
        let short = [WindowSpan { id: 1, alloc_base: 0, alloc_len: 0x2000 }];
        assert!(matches!(verbs_memory(&table, &short, std::ptr::null_mut(), 0, none), Err(Error::InternalError(_))));
    }
}
