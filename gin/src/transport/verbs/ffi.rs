//! The thin FFI layer of the verbs transport: libibverbs loaded at run time.
//!
//! `libibverbs.so.1` is opened with `dlopen` (through `libloading`) when a
//! transport connects, so the crate builds on machines without rdma-core and
//! a missing library is a clean [`GinHostError::Unavailable`] instead of a
//! failure to start the process. Only the few functions and structures the
//! transport uses are declared, `#[repr(C)]` copies of rdma-core's
//! `<infiniband/verbs.h>` (x86-64 / aarch64 LP64 layouts, stable ABI since
//! rdma-core 13; a test compares every size and offset with the system
//! header when one is installed).
//!
//! `ibv_post_send` and `ibv_poll_cq` are `static inline` in `verbs.h`: they
//! are no symbols of the library but calls through the provider's function
//! table in the context, `qp->context->ops.post_send` and
//! `cq->context->ops.poll_cq`. This module does exactly that, with the
//! `ibv_context_ops` layout of the header (legacy slots kept by rdma-core
//! for ABI compatibility). Every other call is an exported symbol, resolved
//! at its default (newest) symbol version, which is the ABI the header
//! describes.
//!
//! All `unsafe` of the transport's library calls lives here; each block says
//! which invariant makes it sound. Objects are owned by [`Hca`] and
//! destroyed in dependency order when it drops.

#![allow(non_camel_case_types)]

use super::plan::WrOpcode;
use crate::{GinHostError, GinResult};
use libloading::Library;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

// ---- constants of verbs.h ----

pub(super) const IBV_WR_RDMA_WRITE: u32 = 0;
pub(super) const IBV_WR_RDMA_READ: u32 = 4;
pub(super) const IBV_WR_ATOMIC_FETCH_AND_ADD: u32 = 6;

pub(super) const IBV_SEND_FENCE: u32 = 1;
pub(super) const IBV_SEND_SIGNALED: u32 = 2;
pub(super) const IBV_SEND_INLINE: u32 = 8;

pub(super) const IBV_ACCESS_LOCAL_WRITE: c_int = 1;
pub(super) const IBV_ACCESS_REMOTE_WRITE: c_int = 2;
pub(super) const IBV_ACCESS_REMOTE_READ: c_int = 4;
pub(super) const IBV_ACCESS_REMOTE_ATOMIC: c_int = 8;

const IBV_QPS_INIT: u32 = 1;
const IBV_QPS_RTR: u32 = 2;
const IBV_QPS_RTS: u32 = 3;
const IBV_QPS_ERR: u32 = 6;

const IBV_QP_STATE: c_int = 1 << 0;
const IBV_QP_ACCESS_FLAGS: c_int = 1 << 3;
const IBV_QP_PKEY_INDEX: c_int = 1 << 4;
const IBV_QP_PORT: c_int = 1 << 5;
const IBV_QP_AV: c_int = 1 << 7;
const IBV_QP_PATH_MTU: c_int = 1 << 8;
const IBV_QP_TIMEOUT: c_int = 1 << 9;
const IBV_QP_RETRY_CNT: c_int = 1 << 10;
const IBV_QP_RNR_RETRY: c_int = 1 << 11;
const IBV_QP_RQ_PSN: c_int = 1 << 12;
const IBV_QP_MAX_QP_RD_ATOMIC: c_int = 1 << 13;
const IBV_QP_MIN_RNR_TIMER: c_int = 1 << 15;
const IBV_QP_SQ_PSN: c_int = 1 << 16;
const IBV_QP_MAX_DEST_RD_ATOMIC: c_int = 1 << 17;
const IBV_QP_DEST_QPN: c_int = 1 << 20;

const IBV_QPT_RC: u32 = 2;

pub(super) const IBV_ATOMIC_NONE: u32 = 0;
pub(super) const IBV_ATOMIC_GLOB: u32 = 2;
pub(super) const IBV_PORT_ACTIVE: u32 = 4;
pub(super) const IBV_LINK_LAYER_ETHERNET: u8 = 2;
const IBV_WC_SUCCESS: u32 = 0;

// ---- structures of verbs.h ----

/// `struct ibv_device` (opaque).
#[repr(C)]
pub(super) struct ibv_device {
    _opaque: [u8; 0],
}

/// `struct ibv_pd` (only handled by pointer).
#[repr(C)]
pub(super) struct ibv_pd {
    _opaque: [u8; 0],
}

/// `struct ibv_comp_channel` (only handled by pointer).
#[repr(C)]
pub(super) struct ibv_comp_channel {
    _opaque: [u8; 0],
}

/// `struct ibv_context_ops`: the provider's function table. Slots named
/// `_compat*` are unused placeholders kept by rdma-core for the ABI.
#[repr(C)]
pub(super) struct ibv_context_ops {
    pub(super) _compat0: [*mut c_void; 11],
    pub(super) poll_cq: Option<unsafe extern "C" fn(*mut ibv_cq, c_int, *mut ibv_wc) -> c_int>,
    pub(super) _compat1: [*mut c_void; 13],
    pub(super) post_send: Option<unsafe extern "C" fn(*mut ibv_qp, *mut ibv_send_wr, *mut *mut ibv_send_wr) -> c_int>,
    pub(super) _compat2: [*mut c_void; 6],
}

/// `struct ibv_context`.
#[repr(C)]
pub(super) struct ibv_context {
    pub(super) device: *mut ibv_device,
    pub(super) ops: ibv_context_ops,
    pub(super) cmd_fd: c_int,
    pub(super) async_fd: c_int,
    pub(super) num_comp_vectors: c_int,
    pub(super) mutex: [u64; 5],
    pub(super) abi_compat: *mut c_void,
}

/// `struct ibv_cq`.
#[repr(C)]
pub(super) struct ibv_cq {
    pub(super) context: *mut ibv_context,
    pub(super) channel: *mut ibv_comp_channel,
    pub(super) cq_context: *mut c_void,
    pub(super) handle: u32,
    pub(super) cqe: c_int,
    pub(super) mutex: [u64; 5],
    pub(super) cond: [u64; 6],
    pub(super) comp_events_completed: u32,
    pub(super) async_events_completed: u32,
}

/// `struct ibv_qp`.
#[repr(C)]
pub(super) struct ibv_qp {
    pub(super) context: *mut ibv_context,
    pub(super) qp_context: *mut c_void,
    pub(super) pd: *mut ibv_pd,
    pub(super) send_cq: *mut ibv_cq,
    pub(super) recv_cq: *mut ibv_cq,
    pub(super) srq: *mut c_void,
    pub(super) handle: u32,
    pub(super) qp_num: u32,
    pub(super) state: u32,
    pub(super) qp_type: u32,
    pub(super) mutex: [u64; 5],
    pub(super) cond: [u64; 6],
    pub(super) events_completed: u32,
}

/// `struct ibv_mr`.
#[repr(C)]
pub(super) struct ibv_mr {
    pub(super) context: *mut ibv_context,
    pub(super) pd: *mut ibv_pd,
    pub(super) addr: *mut c_void,
    pub(super) length: usize,
    pub(super) handle: u32,
    pub(super) lkey: u32,
    pub(super) rkey: u32,
}

/// `struct ibv_sge`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(super) struct ibv_sge {
    pub(super) addr: u64,
    pub(super) length: u32,
    pub(super) lkey: u32,
}

/// `wr.rdma` of `struct ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct ibv_rdma_wr {
    pub(super) remote_addr: u64,
    pub(super) rkey: u32,
}

/// `wr.atomic` of `struct ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct ibv_atomic_wr {
    pub(super) remote_addr: u64,
    pub(super) compare_add: u64,
    pub(super) swap: u64,
    pub(super) rkey: u32,
}

/// The `wr` union of `struct ibv_send_wr` (its `ud` member is 32 bytes too).
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) union ibv_send_wr_wr {
    pub(super) rdma: ibv_rdma_wr,
    pub(super) atomic: ibv_atomic_wr,
    pub(super) _ud: [u64; 4],
}

/// `struct ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct ibv_send_wr {
    pub(super) wr_id: u64,
    pub(super) next: *mut ibv_send_wr,
    pub(super) sg_list: *mut ibv_sge,
    pub(super) num_sge: c_int,
    pub(super) opcode: u32,
    pub(super) send_flags: u32,
    pub(super) imm_data: u32,
    pub(super) wr: ibv_send_wr_wr,
    pub(super) qp_type: u32,
    /// The `bind_mw` / `tso` union (48 bytes), unused here.
    pub(super) bind_mw: [u64; 6],
}

/// `struct ibv_wc`.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub(super) struct ibv_wc {
    pub(super) wr_id: u64,
    pub(super) status: u32,
    pub(super) opcode: u32,
    pub(super) vendor_err: u32,
    pub(super) byte_len: u32,
    pub(super) imm_data: u32,
    pub(super) qp_num: u32,
    pub(super) src_qp: u32,
    pub(super) wc_flags: u32,
    pub(super) pkey_index: u16,
    pub(super) slid: u16,
    pub(super) sl: u8,
    pub(super) dlid_path_bits: u8,
}

/// `union ibv_gid`.
#[repr(C, align(8))]
#[derive(Clone, Copy, Default)]
pub(super) struct ibv_gid {
    pub(super) raw: [u8; 16],
}

/// `struct ibv_global_route`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(super) struct ibv_global_route {
    pub(super) dgid: ibv_gid,
    pub(super) flow_label: u32,
    pub(super) sgid_index: u8,
    pub(super) hop_limit: u8,
    pub(super) traffic_class: u8,
}

/// `struct ibv_ah_attr`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(super) struct ibv_ah_attr {
    pub(super) grh: ibv_global_route,
    pub(super) dlid: u16,
    pub(super) sl: u8,
    pub(super) src_path_bits: u8,
    pub(super) static_rate: u8,
    pub(super) is_global: u8,
    pub(super) port_num: u8,
}

/// `struct ibv_qp_cap`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(super) struct ibv_qp_cap {
    pub(super) max_send_wr: u32,
    pub(super) max_recv_wr: u32,
    pub(super) max_send_sge: u32,
    pub(super) max_recv_sge: u32,
    pub(super) max_inline_data: u32,
}

/// `struct ibv_qp_init_attr`.
#[repr(C)]
pub(super) struct ibv_qp_init_attr {
    pub(super) qp_context: *mut c_void,
    pub(super) send_cq: *mut ibv_cq,
    pub(super) recv_cq: *mut ibv_cq,
    pub(super) srq: *mut c_void,
    pub(super) cap: ibv_qp_cap,
    pub(super) qp_type: u32,
    pub(super) sq_sig_all: c_int,
}

/// `struct ibv_qp_attr`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(super) struct ibv_qp_attr {
    pub(super) qp_state: u32,
    pub(super) cur_qp_state: u32,
    pub(super) path_mtu: u32,
    pub(super) path_mig_state: u32,
    pub(super) qkey: u32,
    pub(super) rq_psn: u32,
    pub(super) sq_psn: u32,
    pub(super) dest_qp_num: u32,
    pub(super) qp_access_flags: c_int,
    pub(super) cap: ibv_qp_cap,
    pub(super) ah_attr: ibv_ah_attr,
    pub(super) alt_ah_attr: ibv_ah_attr,
    pub(super) pkey_index: u16,
    pub(super) alt_pkey_index: u16,
    pub(super) en_sqd_async_notify: u8,
    pub(super) sq_draining: u8,
    pub(super) max_rd_atomic: u8,
    pub(super) max_dest_rd_atomic: u8,
    pub(super) min_rnr_timer: u8,
    pub(super) port_num: u8,
    pub(super) timeout: u8,
    pub(super) retry_cnt: u8,
    pub(super) rnr_retry: u8,
    pub(super) alt_port_num: u8,
    pub(super) alt_timeout: u8,
    pub(super) rate_limit: u32,
}

/// `struct ibv_port_attr`, with room to spare at the end: the exported
/// `ibv_query_port` writes the (shorter) compat layout's bytes only, newer
/// headers append fields.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(super) struct ibv_port_attr {
    pub(super) state: u32,
    pub(super) max_mtu: u32,
    pub(super) active_mtu: u32,
    pub(super) gid_tbl_len: c_int,
    pub(super) port_cap_flags: u32,
    pub(super) max_msg_sz: u32,
    pub(super) bad_pkey_cntr: u32,
    pub(super) qkey_viol_cntr: u32,
    pub(super) pkey_tbl_len: u16,
    pub(super) lid: u16,
    pub(super) sm_lid: u16,
    pub(super) lmc: u8,
    pub(super) max_vl_num: u8,
    pub(super) sm_sl: u8,
    pub(super) subnet_timeout: u8,
    pub(super) init_type_reply: u8,
    pub(super) active_width: u8,
    pub(super) active_speed: u8,
    pub(super) phys_state: u8,
    pub(super) link_layer: u8,
    pub(super) flags: u8,
    pub(super) port_cap_flags2: u16,
    pub(super) _spare: [u32; 16],
}

/// `struct ibv_device_attr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct ibv_device_attr {
    pub(super) fw_ver: [c_char; 64],
    pub(super) node_guid: u64,
    pub(super) sys_image_guid: u64,
    pub(super) max_mr_size: u64,
    pub(super) page_size_cap: u64,
    pub(super) vendor_id: u32,
    pub(super) vendor_part_id: u32,
    pub(super) hw_ver: u32,
    pub(super) max_qp: c_int,
    pub(super) max_qp_wr: c_int,
    pub(super) device_cap_flags: u32,
    pub(super) max_sge: c_int,
    pub(super) max_sge_rd: c_int,
    pub(super) max_cq: c_int,
    pub(super) max_cqe: c_int,
    pub(super) max_mr: c_int,
    pub(super) max_pd: c_int,
    pub(super) max_qp_rd_atom: c_int,
    pub(super) max_ee_rd_atom: c_int,
    pub(super) max_res_rd_atom: c_int,
    pub(super) max_qp_init_rd_atom: c_int,
    pub(super) max_ee_init_rd_atom: c_int,
    pub(super) atomic_cap: u32,
    pub(super) max_ee: c_int,
    pub(super) max_rdd: c_int,
    pub(super) max_mw: c_int,
    pub(super) max_raw_ipv6_qp: c_int,
    pub(super) max_raw_ethy_qp: c_int,
    pub(super) max_mcast_grp: c_int,
    pub(super) max_mcast_qp_attach: c_int,
    pub(super) max_total_mcast_qp_attach: c_int,
    pub(super) max_ah: c_int,
    pub(super) max_fmr: c_int,
    pub(super) max_map_per_fmr: c_int,
    pub(super) max_srq: c_int,
    pub(super) max_srq_wr: c_int,
    pub(super) max_srq_sge: c_int,
    pub(super) max_pkeys: u16,
    pub(super) local_ca_ack_delay: u8,
    pub(super) phys_port_cnt: u8,
}

// ---- the library ----

type GetDeviceList = unsafe extern "C" fn(*mut c_int) -> *mut *mut ibv_device;
type FreeDeviceList = unsafe extern "C" fn(*mut *mut ibv_device);
type GetDeviceName = unsafe extern "C" fn(*mut ibv_device) -> *const c_char;
type OpenDevice = unsafe extern "C" fn(*mut ibv_device) -> *mut ibv_context;
type CloseDevice = unsafe extern "C" fn(*mut ibv_context) -> c_int;
type QueryDevice = unsafe extern "C" fn(*mut ibv_context, *mut ibv_device_attr) -> c_int;
type QueryPort = unsafe extern "C" fn(*mut ibv_context, u8, *mut ibv_port_attr) -> c_int;
type QueryGid = unsafe extern "C" fn(*mut ibv_context, u8, c_int, *mut ibv_gid) -> c_int;
type AllocPd = unsafe extern "C" fn(*mut ibv_context) -> *mut ibv_pd;
type DeallocPd = unsafe extern "C" fn(*mut ibv_pd) -> c_int;
type RegMr = unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, c_int) -> *mut ibv_mr;
type RegDmabufMr = unsafe extern "C" fn(*mut ibv_pd, u64, usize, u64, c_int, c_int) -> *mut ibv_mr;
type DeregMr = unsafe extern "C" fn(*mut ibv_mr) -> c_int;
type CreateCq = unsafe extern "C" fn(*mut ibv_context, c_int, *mut c_void, *mut ibv_comp_channel, c_int) -> *mut ibv_cq;
type DestroyCq = unsafe extern "C" fn(*mut ibv_cq) -> c_int;
type CreateQp = unsafe extern "C" fn(*mut ibv_pd, *mut ibv_qp_init_attr) -> *mut ibv_qp;
type ModifyQp = unsafe extern "C" fn(*mut ibv_qp, *mut ibv_qp_attr, c_int) -> c_int;
type DestroyQp = unsafe extern "C" fn(*mut ibv_qp) -> c_int;
type WcStatusStr = unsafe extern "C" fn(u32) -> *const c_char;

/// libibverbs, opened, with the functions the transport calls.
pub(super) struct Verbs {
    get_device_list: GetDeviceList,
    free_device_list: FreeDeviceList,
    get_device_name: GetDeviceName,
    open_device: OpenDevice,
    close_device: CloseDevice,
    query_device: QueryDevice,
    query_port: QueryPort,
    query_gid: QueryGid,
    alloc_pd: AllocPd,
    dealloc_pd: DeallocPd,
    reg_mr: RegMr,
    reg_dmabuf_mr: Option<RegDmabufMr>,
    dereg_mr: DeregMr,
    create_cq: CreateCq,
    destroy_cq: DestroyCq,
    create_qp: CreateQp,
    modify_qp: ModifyQp,
    destroy_qp: DestroyQp,
    wc_status_str: WcStatusStr,
    /// Keeps the library mapped while the pointers above are used; never
    /// unloaded before them (they live in the same value).
    _lib: Library,
}

impl std::fmt::Debug for Verbs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Verbs").field("dmabuf", &self.reg_dmabuf_mr.is_some()).finish_non_exhaustive()
    }
}

fn unavailable(msg: String) -> GinHostError {
    GinHostError::Unavailable(msg)
}

fn os_error(what: &str) -> GinHostError {
    GinHostError::System(format!("{what}: {}", std::io::Error::last_os_error()))
}

/// `rc` of a verbs call that returns an errno (or -1 with `errno` set).
fn rc_error(what: &str, rc: c_int) -> GinHostError {
    let e = if rc > 0 { std::io::Error::from_raw_os_error(rc) } else { std::io::Error::last_os_error() };
    GinHostError::System(format!("{what}: {e}"))
}

impl Verbs {
    /// Opens `name` (normally `libibverbs.so.1`) and resolves the symbols.
    /// `Unavailable` if the library or a required symbol is missing.
    pub(super) fn load(name: &str) -> GinResult<Arc<Verbs>> {
        // SAFETY: loading libibverbs runs its ELF constructors, which only
        // initialise the library's own state (no unsound global side effects).
        let lib = unsafe { Library::new(name) }.map_err(|e| {
            unavailable(format!(
                "{name} could not be loaded ({e}); install rdma-core's libibverbs \
                 (Debian/Ubuntu: libibverbs1 and ibverbs-providers) to use the verbs transport"
            ))
        })?;
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: the symbol is libibverbs' function of this name, and
                // the type is its C prototype in verbs.h (checked by
                // `abi_matches_verbs_h`); the pointer is used only while `lib`
                // (kept in the same `Verbs`) stays loaded.
                *unsafe { lib.get($name) }
                    .map_err(|e| unavailable(format!("{name} lacks {}: {e}", $name.trim_end_matches('\0'))))?
            };
        }
        Ok(Arc::new(Verbs {
            get_device_list: sym!("ibv_get_device_list\0"),
            free_device_list: sym!("ibv_free_device_list\0"),
            get_device_name: sym!("ibv_get_device_name\0"),
            open_device: sym!("ibv_open_device\0"),
            close_device: sym!("ibv_close_device\0"),
            query_device: sym!("ibv_query_device\0"),
            query_port: sym!("ibv_query_port\0"),
            query_gid: sym!("ibv_query_gid\0"),
            alloc_pd: sym!("ibv_alloc_pd\0"),
            dealloc_pd: sym!("ibv_dealloc_pd\0"),
            reg_mr: sym!("ibv_reg_mr\0"),
            // SAFETY: as in `sym!` (optional: rdma-core >= 34 only).
            reg_dmabuf_mr: unsafe { lib.get::<RegDmabufMr>("ibv_reg_dmabuf_mr\0") }.ok().map(|s| *s),
            dereg_mr: sym!("ibv_dereg_mr\0"),
            create_cq: sym!("ibv_create_cq\0"),
            destroy_cq: sym!("ibv_destroy_cq\0"),
            create_qp: sym!("ibv_create_qp\0"),
            modify_qp: sym!("ibv_modify_qp\0"),
            destroy_qp: sym!("ibv_destroy_qp\0"),
            wc_status_str: sym!("ibv_wc_status_str\0"),
            _lib: lib,
        }))
    }

    /// Whether `ibv_reg_dmabuf_mr` exists (rdma-core >= 34).
    pub(super) fn has_dmabuf(&self) -> bool {
        self.reg_dmabuf_mr.is_some()
    }

    /// Runs `f` over the device list (`Unavailable` if there is none).
    fn with_devices<T>(&self, f: impl FnOnce(&[*mut ibv_device]) -> GinResult<T>) -> GinResult<T> {
        let mut n: c_int = 0;
        // SAFETY: `n` is a valid out-pointer; the list is freed below.
        let list = unsafe { (self.get_device_list)(&mut n) };
        if list.is_null() {
            let e = std::io::Error::last_os_error();
            return Err(unavailable(format!(
                "no RDMA device: ibv_get_device_list failed ({e}){}",
                if e.raw_os_error() == Some(libc_enosys()) {
                    "; this kernel has no RDMA (InfiniBand verbs) support"
                } else {
                    ""
                }
            )));
        }
        // SAFETY: a non-null list holds `n` valid device pointers until freed.
        let devs = unsafe { std::slice::from_raw_parts(list, n.max(0) as usize) };
        let r = f(devs);
        // SAFETY: `list` came from ibv_get_device_list and is freed once;
        // contexts opened from it stay valid (they hold their own reference).
        unsafe { (self.free_device_list)(list) };
        r
    }

    fn device_name(&self, d: *mut ibv_device) -> String {
        // SAFETY: `d` is a live entry of the device list; the name is a
        // NUL-terminated string owned by the device.
        let p = unsafe { (self.get_device_name)(d) };
        if p.is_null() {
            return String::from("?");
        }
        // SAFETY: non-null, NUL-terminated (above).
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    /// Names of the RDMA devices (`Unavailable` if the kernel has no RDMA
    /// support; an empty list if it has but no device exists).
    pub(super) fn device_names(&self) -> GinResult<Vec<String>> {
        self.with_devices(|devs| Ok(devs.iter().map(|&d| self.device_name(d)).collect()))
    }

    /// Text of a work-completion status.
    pub(super) fn status_str(&self, status: u32) -> String {
        // SAFETY: ibv_wc_status_str accepts any value and returns a static string.
        let p = unsafe { (self.wc_status_str)(status) };
        if p.is_null() {
            return format!("status {status}");
        }
        // SAFETY: non-null static NUL-terminated string.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

/// ENOSYS on Linux (all architectures the transport targets).
const fn libc_enosys() -> i32 {
    38
}

/// What the transport needs of the device's limits.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct DeviceCaps {
    pub(super) max_qp_wr: u32,
    pub(super) max_cqe: u32,
    pub(super) max_qp_rd_atom: u8,
    pub(super) max_qp_init_rd_atom: u8,
    pub(super) atomic_cap: u32,
    pub(super) phys_port_cnt: u8,
}

/// What the transport needs of a port.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct PortInfo {
    pub(super) state: u32,
    pub(super) active_mtu: u8,
    pub(super) lid: u16,
    pub(super) link_layer: u8,
    pub(super) max_msg_sz: u32,
    pub(super) gid_tbl_len: i32,
}

/// Keys of a registered memory region.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MrKeys {
    /// The local key (work requests' local buffers).
    pub lkey: u32,
    /// The remote key (what peers name in RDMA WRITE and READ).
    pub rkey: u32,
}

/// A created queue pair.
#[derive(Clone, Copy, Debug, Default)]
pub struct QpCaps {
    /// Its number.
    pub qpn: u32,
    /// Send-queue depth the device granted.
    pub max_send_wr: u32,
    /// Inline bytes the device granted.
    pub max_inline_data: u32,
}

/// The global route header of an address (RoCE, or IB across subnets).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Grh {
    pub(super) dgid: [u8; 16],
    pub(super) sgid_index: u8,
    pub(super) hop_limit: u8,
    pub(super) traffic_class: u8,
}

/// INIT → RTR attributes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct RtrParams {
    pub(super) port: u8,
    pub(super) mtu: u8,
    pub(super) dest_qpn: u32,
    pub(super) rq_psn: u32,
    pub(super) dlid: u16,
    pub(super) sl: u8,
    pub(super) grh: Option<Grh>,
    pub(super) max_dest_rd_atomic: u8,
    pub(super) min_rnr_timer: u8,
}

/// RTR → RTS attributes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct RtsParams {
    pub(super) sq_psn: u32,
    pub(super) timeout: u8,
    pub(super) retry_cnt: u8,
    pub(super) rnr_retry: u8,
    pub(super) max_rd_atomic: u8,
}

/// One work request, resolved to addresses and keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PostWr {
    /// Returned in its completion.
    pub wr_id: u64,
    /// What it does.
    pub opcode: WrOpcode,
    /// Local buffer: address, length, lkey (lkey ignored when inline).
    pub sge: (u64, u32, u32),
    /// Remote address (RDMA WRITE/READ, atomics).
    pub remote_addr: u64,
    /// Remote key of the registration holding the remote range.
    pub rkey: u32,
    /// The increment of a fetch-and-add.
    pub add: u64,
    /// `IBV_SEND_FENCE`.
    pub fence: bool,
    /// `IBV_SEND_SIGNALED`: a completion comes for it.
    pub signaled: bool,
    /// `IBV_SEND_INLINE`.
    pub inline: bool,
}

/// One work completion.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Completion {
    /// The request's `wr_id`.
    pub wr_id: u64,
    /// `ibv_wc_status` (0: success).
    pub status: u32,
    /// The vendor's error code.
    pub vendor_err: u32,
    /// The queue pair's number.
    pub qp_num: u32,
}

impl Completion {
    /// Whether the request succeeded.
    pub fn ok(&self) -> bool {
        self.status == IBV_WC_SUCCESS
    }
}

/// An opened device with the transport's objects: protection domain, one
/// completion queue, queue pairs and memory regions. Dropping it destroys
/// them (queue pairs, memory regions, completion queue, protection domain,
/// context, in this order).
pub(super) struct Hca {
    verbs: Arc<Verbs>,
    ctx: *mut ibv_context,
    pd: *mut ibv_pd,
    cq: *mut ibv_cq,
    qps: Vec<*mut ibv_qp>,
    mrs: Vec<*mut ibv_mr>,
    wcs: Vec<ibv_wc>,
    name: String,
}

// SAFETY: the verbs objects may be used from any thread (libibverbs is
// thread-safe); the transport uses them from one thread at a time (`&mut`).
unsafe impl Send for Hca {}

impl std::fmt::Debug for Hca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hca").field("name", &self.name).field("qps", &self.qps.len()).finish_non_exhaustive()
    }
}

impl Hca {
    /// Opens device `name`, or the first device if `None`, and allocates a
    /// protection domain.
    pub(super) fn open(verbs: Arc<Verbs>, name: Option<&str>) -> GinResult<Hca> {
        let (ctx, name) = verbs.with_devices(|devs| {
            if devs.is_empty() {
                return Err(unavailable(
                    "no RDMA device found (libibverbs is installed, ibv_get_device_list returned none)".into(),
                ));
            }
            let names: Vec<String> = devs.iter().map(|&d| verbs.device_name(d)).collect();
            let i = match name {
                None => 0,
                Some(n) => names.iter().position(|x| x == n).ok_or_else(|| {
                    unavailable(format!("RDMA device {n:?} not found (devices: {})", names.join(", ")))
                })?,
            };
            // SAFETY: `devs[i]` is a live entry of the list.
            let ctx = unsafe { (verbs.open_device)(devs[i]) };
            if ctx.is_null() {
                return Err(os_error(&format!("ibv_open_device({})", names[i])));
            }
            Ok((ctx, names[i].clone()))
        })?;
        let mut hca = Hca {
            verbs,
            ctx,
            pd: std::ptr::null_mut(),
            cq: std::ptr::null_mut(),
            qps: Vec::new(),
            mrs: Vec::new(),
            wcs: Vec::new(),
            name,
        };
        // SAFETY: `ctx` is an open context.
        hca.pd = unsafe { (hca.verbs.alloc_pd)(hca.ctx) };
        if hca.pd.is_null() {
            return Err(os_error("ibv_alloc_pd"));
        }
        Ok(hca)
    }

    /// The device's name.
    pub(super) fn name(&self) -> &str {
        &self.name
    }

    /// The library.
    pub(super) fn verbs(&self) -> &Arc<Verbs> {
        &self.verbs
    }

    /// The device's limits.
    pub(super) fn query_device(&self) -> GinResult<DeviceCaps> {
        // SAFETY: all-zero bytes are a valid ibv_device_attr (integers only).
        let mut a: ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: open context, valid out-pointer of the header's layout.
        let rc = unsafe { (self.verbs.query_device)(self.ctx, &mut a) };
        if rc != 0 {
            return Err(rc_error("ibv_query_device", rc));
        }
        let clamp_u8 = |v: c_int| v.clamp(0, 255) as u8;
        Ok(DeviceCaps {
            max_qp_wr: a.max_qp_wr.max(0) as u32,
            max_cqe: a.max_cqe.max(0) as u32,
            max_qp_rd_atom: clamp_u8(a.max_qp_rd_atom),
            max_qp_init_rd_atom: clamp_u8(a.max_qp_init_rd_atom),
            atomic_cap: a.atomic_cap,
            phys_port_cnt: a.phys_port_cnt,
        })
    }

    /// Port `port`'s attributes.
    pub(super) fn query_port(&self, port: u8) -> GinResult<PortInfo> {
        let mut a = ibv_port_attr::default();
        // SAFETY: open context; `a` is at least as large as what the
        // exported ibv_query_port writes (its compat layout).
        let rc = unsafe { (self.verbs.query_port)(self.ctx, port, &mut a) };
        if rc != 0 {
            return Err(rc_error(&format!("ibv_query_port({}, {port})", self.name), rc));
        }
        Ok(PortInfo {
            state: a.state,
            active_mtu: a.active_mtu.min(255) as u8,
            lid: a.lid,
            link_layer: a.link_layer,
            max_msg_sz: a.max_msg_sz,
            gid_tbl_len: a.gid_tbl_len,
        })
    }

    /// GID `index` of `port`.
    pub(super) fn query_gid(&self, port: u8, index: u8) -> GinResult<[u8; 16]> {
        let mut g = ibv_gid::default();
        // SAFETY: open context, valid out-pointer.
        let rc = unsafe { (self.verbs.query_gid)(self.ctx, port, index as c_int, &mut g) };
        if rc != 0 {
            return Err(rc_error(&format!("ibv_query_gid({}, port {port}, index {index})", self.name), rc));
        }
        Ok(g.raw)
    }

    fn keep_mr(&mut self, mr: *mut ibv_mr, what: &str) -> GinResult<MrKeys> {
        if mr.is_null() {
            return Err(os_error(what));
        }
        self.mrs.push(mr);
        // SAFETY: a non-null MR returned by libibverbs, alive until dereg.
        let keys = unsafe { MrKeys { lkey: (*mr).lkey, rkey: (*mr).rkey } };
        Ok(keys)
    }

    /// Registers `len` bytes at virtual address `addr` (host memory, or
    /// device memory where the kernel can pin it: nvidia-peermem).
    ///
    /// # Safety
    /// The range stays allocated (and mapped) until this `Hca` is dropped:
    /// the NIC reads and writes it asynchronously.
    pub(super) unsafe fn reg_mr(&mut self, addr: u64, len: u64, access: c_int) -> GinResult<MrKeys> {
        // SAFETY: open PD; the range's lifetime is the caller's contract.
        let mr = unsafe { (self.verbs.reg_mr)(self.pd, addr as *mut c_void, len as usize, access) };
        self.keep_mr(mr, &format!("ibv_reg_mr({len} bytes at {addr:#x})"))
    }

    /// Registers `len` bytes at `offset` of the dmabuf `fd`, reachable at
    /// address `iova` (GPUDirect RDMA through dmabuf).
    ///
    /// # Safety
    /// `fd` is an open dmabuf file descriptor; the memory behind it stays
    /// allocated until this `Hca` is dropped (the registration holds its own
    /// reference to the dmabuf, so `fd` itself may be closed afterwards).
    pub(super) unsafe fn reg_dmabuf_mr(
        &mut self,
        offset: u64,
        len: u64,
        iova: u64,
        fd: c_int,
        access: c_int,
    ) -> GinResult<MrKeys> {
        let Some(f) = self.verbs.reg_dmabuf_mr else {
            return Err(unavailable(
                "this libibverbs has no ibv_reg_dmabuf_mr (rdma-core 34 or newer is needed for dmabuf windows)".into(),
            ));
        };
        // SAFETY: open PD; the fd and memory lifetime are the caller's contract.
        let mr = unsafe { f(self.pd, offset, len as usize, iova, fd, access) };
        self.keep_mr(mr, &format!("ibv_reg_dmabuf_mr({len} bytes of fd {fd} at iova {iova:#x})"))
    }

    /// Deregisters the region with local key `lkey` (registered by this
    /// `Hca`); `Invalid` if there is none.
    pub(super) fn dereg_mr(&mut self, lkey: u32) -> GinResult<()> {
        // SAFETY: every entry of `mrs` is a live MR of this Hca.
        let i = self.mrs.iter().position(|&m| unsafe { (*m).lkey } == lkey);
        let i = i.ok_or_else(|| GinHostError::Invalid(format!("no memory region with lkey {lkey:#x}")))?;
        let m = self.mrs.swap_remove(i);
        // SAFETY: a live MR, removed from `mrs` so deregistered once; the
        // caller no longer names it in new work requests.
        let rc = unsafe { (self.verbs.dereg_mr)(m) };
        if rc != 0 {
            return Err(rc_error("ibv_dereg_mr", rc));
        }
        Ok(())
    }

    /// Destroys queue pair `qp` (its index stays taken; later calls naming
    /// it fail with `Invalid`).
    pub(super) fn destroy_qp(&mut self, qp: usize) -> GinResult<()> {
        let q = self.qps.get_mut(qp).ok_or_else(|| GinHostError::Invalid(format!("no queue pair {qp}")))?;
        let p = std::mem::replace(q, std::ptr::null_mut());
        if p.is_null() {
            return Ok(());
        }
        // SAFETY: a live QP of this Hca, destroyed once (its slot is null now).
        let rc = unsafe { (self.verbs.destroy_qp)(p) };
        if rc != 0 {
            return Err(rc_error("ibv_destroy_qp", rc));
        }
        Ok(())
    }

    /// Creates the completion queue (of at least `cqe` entries).
    pub(super) fn create_cq(&mut self, cqe: u32) -> GinResult<()> {
        // SAFETY: open context; no channel (polled), vector 0.
        let cq = unsafe {
            (self.verbs.create_cq)(
                self.ctx,
                cqe.min(i32::MAX as u32) as c_int,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            )
        };
        if cq.is_null() {
            return Err(os_error(&format!("ibv_create_cq({cqe})")));
        }
        self.cq = cq;
        self.wcs = vec![ibv_wc::default(); 64];
        Ok(())
    }

    /// Creates an RC queue pair on the completion queue (send side only:
    /// no receive work requests are ever posted) and returns its index and caps.
    pub(super) fn create_qp(&mut self, depth: u32, max_inline: u32) -> GinResult<(usize, QpCaps)> {
        let mut init = ibv_qp_init_attr {
            qp_context: std::ptr::null_mut(),
            send_cq: self.cq,
            recv_cq: self.cq,
            srq: std::ptr::null_mut(),
            cap: ibv_qp_cap {
                max_send_wr: depth,
                max_recv_wr: 1,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: max_inline,
            },
            qp_type: IBV_QPT_RC,
            sq_sig_all: 0,
        };
        if self.cq.is_null() {
            return Err(GinHostError::Invalid("create_qp before create_cq".into()));
        }
        // SAFETY: open PD and CQ; `init` is a valid attribute struct; the
        // provider writes the actual caps back into it.
        let qp = unsafe { (self.verbs.create_qp)(self.pd, &mut init) };
        if qp.is_null() {
            return Err(os_error(&format!("ibv_create_qp(RC, {depth} send WRs, {max_inline} inline bytes)")));
        }
        self.qps.push(qp);
        // SAFETY: a live QP returned by libibverbs.
        let qpn = unsafe { (*qp).qp_num };
        Ok((
            self.qps.len() - 1,
            QpCaps { qpn, max_send_wr: init.cap.max_send_wr, max_inline_data: init.cap.max_inline_data },
        ))
    }

    fn modify(&self, qp: usize, attr: &mut ibv_qp_attr, mask: c_int, what: &str) -> GinResult<()> {
        let q = *self
            .qps
            .get(qp)
            .filter(|q| !q.is_null())
            .ok_or_else(|| GinHostError::Invalid(format!("no queue pair {qp}")))?;
        // SAFETY: a live QP (destroyed ones are null); `attr` is a valid attribute struct for `mask`.
        let rc = unsafe { (self.verbs.modify_qp)(q, attr, mask) };
        if rc != 0 {
            return Err(rc_error(&format!("ibv_modify_qp({what})"), rc));
        }
        Ok(())
    }

    /// RESET → INIT on `port` with remote `access`.
    pub(super) fn modify_init(&self, qp: usize, port: u8, access: c_int) -> GinResult<()> {
        let mut a = ibv_qp_attr {
            qp_state: IBV_QPS_INIT,
            pkey_index: 0,
            port_num: port,
            qp_access_flags: access,
            ..Default::default()
        };
        self.modify(qp, &mut a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, "INIT")
    }

    /// INIT → RTR.
    pub(super) fn modify_rtr(&self, qp: usize, p: &RtrParams) -> GinResult<()> {
        let mut a = ibv_qp_attr {
            qp_state: IBV_QPS_RTR,
            path_mtu: p.mtu as u32,
            dest_qp_num: p.dest_qpn,
            rq_psn: p.rq_psn,
            max_dest_rd_atomic: p.max_dest_rd_atomic,
            min_rnr_timer: p.min_rnr_timer,
            ..Default::default()
        };
        a.ah_attr.dlid = p.dlid;
        a.ah_attr.sl = p.sl;
        a.ah_attr.port_num = p.port;
        if let Some(g) = p.grh {
            a.ah_attr.is_global = 1;
            a.ah_attr.grh.dgid.raw = g.dgid;
            a.ah_attr.grh.sgid_index = g.sgid_index;
            a.ah_attr.grh.hop_limit = g.hop_limit;
            a.ah_attr.grh.traffic_class = g.traffic_class;
        }
        let mask = IBV_QP_STATE
            | IBV_QP_AV
            | IBV_QP_PATH_MTU
            | IBV_QP_DEST_QPN
            | IBV_QP_RQ_PSN
            | IBV_QP_MAX_DEST_RD_ATOMIC
            | IBV_QP_MIN_RNR_TIMER;
        self.modify(qp, &mut a, mask, "RTR")
    }

    /// RTR → RTS.
    pub(super) fn modify_rts(&self, qp: usize, p: &RtsParams) -> GinResult<()> {
        let mut a = ibv_qp_attr {
            qp_state: IBV_QPS_RTS,
            sq_psn: p.sq_psn,
            timeout: p.timeout,
            retry_cnt: p.retry_cnt,
            rnr_retry: p.rnr_retry,
            max_rd_atomic: p.max_rd_atomic,
            ..Default::default()
        };
        let mask = IBV_QP_STATE
            | IBV_QP_TIMEOUT
            | IBV_QP_RETRY_CNT
            | IBV_QP_RNR_RETRY
            | IBV_QP_SQ_PSN
            | IBV_QP_MAX_QP_RD_ATOMIC;
        self.modify(qp, &mut a, mask, "RTS")
    }

    /// Any state → ERR: outstanding requests are flushed, nothing more is
    /// sent or accepted.
    pub(super) fn modify_error(&self, qp: usize) -> GinResult<()> {
        let mut a = ibv_qp_attr { qp_state: IBV_QPS_ERR, ..Default::default() };
        self.modify(qp, &mut a, IBV_QP_STATE, "ERR")
    }

    /// Posts one work request on queue pair `qp`; `Err(errno)` if refused.
    ///
    /// # Safety
    /// The local buffer `wr.sge` is registered with lkey `wr.sge.2` (or,
    /// when `wr.inline`, readable host memory for the duration of the call)
    /// and stays allocated until the request's completion is known; the
    /// remote range belongs to the peer's registration `wr.rkey`.
    pub(super) unsafe fn post(&self, qp: usize, wr: &PostWr) -> Result<(), c_int> {
        let Some(&q) = self.qps.get(qp).filter(|q| !q.is_null()) else { return Err(22) };
        let mut sge = ibv_sge { addr: wr.sge.0, length: wr.sge.1, lkey: wr.sge.2 };
        let (opcode, remote) = match wr.opcode {
            WrOpcode::RdmaWrite => {
                (IBV_WR_RDMA_WRITE, ibv_send_wr_wr { rdma: ibv_rdma_wr { remote_addr: wr.remote_addr, rkey: wr.rkey } })
            }
            WrOpcode::RdmaRead => {
                (IBV_WR_RDMA_READ, ibv_send_wr_wr { rdma: ibv_rdma_wr { remote_addr: wr.remote_addr, rkey: wr.rkey } })
            }
            WrOpcode::AtomicFetchAdd => (
                IBV_WR_ATOMIC_FETCH_AND_ADD,
                ibv_send_wr_wr {
                    atomic: ibv_atomic_wr { remote_addr: wr.remote_addr, compare_add: wr.add, swap: 0, rkey: wr.rkey },
                },
            ),
        };
        let flags = if wr.fence { IBV_SEND_FENCE } else { 0 }
            | if wr.signaled { IBV_SEND_SIGNALED } else { 0 }
            | if wr.inline { IBV_SEND_INLINE } else { 0 };
        let mut w = ibv_send_wr {
            wr_id: wr.wr_id,
            next: std::ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: if wr.sge.1 == 0 { 0 } else { 1 },
            opcode,
            send_flags: flags,
            imm_data: 0,
            wr: remote,
            qp_type: 0,
            bind_mw: [0; 6],
        };
        let mut bad: *mut ibv_send_wr = std::ptr::null_mut();
        // SAFETY: `q` is a live QP whose `context` is the open context; its
        // ops table is the provider's (verbs.h's inline ibv_post_send does
        // the same call). `w` and `sge` outlive the call (the provider copies
        // them into the send queue; inline data is copied too); the buffers
        // they name are the caller's contract.
        let rc = unsafe {
            let ctx = (*q).context;
            match (*ctx).ops.post_send {
                Some(f) => f(q, &mut w, &mut bad),
                None => 95, // EOPNOTSUPP
            }
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(rc)
        }
    }

    /// Polls the completion queue once, appending what it returned to `out`;
    /// returns how many. `System` if polling fails (the CQ is broken).
    pub(super) fn poll(&mut self, out: &mut Vec<Completion>) -> GinResult<usize> {
        if self.cq.is_null() {
            return Ok(0);
        }
        // SAFETY: `cq` is live and its context's ops table is the provider's
        // (verbs.h's inline ibv_poll_cq does the same call); `wcs` has room
        // for the number of entries asked for.
        let n = unsafe {
            let ctx = (*self.cq).context;
            match (*ctx).ops.poll_cq {
                Some(f) => f(self.cq, self.wcs.len() as c_int, self.wcs.as_mut_ptr()),
                None => -1,
            }
        };
        if n < 0 {
            return Err(GinHostError::System(format!("ibv_poll_cq on {} failed ({n})", self.name)));
        }
        let n = n as usize;
        out.extend(self.wcs[..n].iter().map(|w| Completion {
            wr_id: w.wr_id,
            status: w.status,
            vendor_err: w.vendor_err,
            qp_num: w.qp_num,
        }));
        Ok(n)
    }
}

impl Drop for Hca {
    fn drop(&mut self) {
        // SAFETY: every pointer below was returned by libibverbs, is
        // destroyed once, and in dependency order (QPs before the CQ and PD,
        // MRs before the PD, the PD before the context).
        unsafe {
            for &q in self.qps.iter().filter(|q| !q.is_null()) {
                (self.verbs.destroy_qp)(q);
            }
            for &m in &self.mrs {
                (self.verbs.dereg_mr)(m);
            }
            if !self.cq.is_null() {
                (self.verbs.destroy_cq)(self.cq);
            }
            if !self.pd.is_null() {
                (self.verbs.dealloc_pd)(self.pd);
            }
            (self.verbs.close_device)(self.ctx);
        }
    }
}

/// Page-aligned, zeroed host memory the NIC reads or writes (staging ring,
/// scratch word, control words). Freed on drop, which must come after the
/// [`Hca`] that registered it.
pub(super) struct HostBuf {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: plain memory; accesses follow `HostBuf`'s methods' contracts.
unsafe impl Send for HostBuf {}

impl std::fmt::Debug for HostBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostBuf").field("ptr", &self.ptr).field("len", &self.len).finish()
    }
}

const PAGE: usize = 4096;

impl HostBuf {
    /// `len` zeroed bytes (at least 8), 4096-aligned.
    pub(super) fn new(len: usize) -> GinResult<HostBuf> {
        let len = len.max(8).next_multiple_of(PAGE);
        let layout = std::alloc::Layout::from_size_align(len, PAGE)
            .map_err(|e| GinHostError::Invalid(format!("host buffer of {len} bytes: {e}")))?;
        // SAFETY: non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(GinHostError::System(format!("out of memory allocating {len} bytes")));
        }
        Ok(HostBuf { ptr, len })
    }

    /// Its address.
    pub(super) fn addr(&self) -> u64 {
        self.ptr as u64
    }

    /// Its length.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Bytes `off..off + len`, for the CPU to fill.
    ///
    /// # Safety
    /// The range is in bounds and the NIC does not access it now (no posted,
    /// incomplete request names it), and no other slice of it is alive.
    pub(super) unsafe fn slice_mut(&mut self, off: usize, len: usize) -> &mut [u8] {
        debug_assert!(off + len <= self.len);
        // SAFETY: the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(off), len) }
    }

    /// Atomically loads u64 word `i` (written by the NIC).
    pub(super) fn load_word(&self, i: usize) -> u64 {
        assert!(i < self.len / 8, "word {i} out of range");
        // SAFETY: in bounds, 8-aligned (page-aligned base), and every CPU
        // access to these words is atomic (the NIC writes aligned 8 bytes).
        unsafe { AtomicU64::from_ptr(self.ptr.add(8 * i) as *mut u64) }.load(Ordering::Acquire)
    }
}

impl Drop for HostBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout (which it validated).
        unsafe { std::alloc::dealloc(self.ptr, std::alloc::Layout::from_size_align_unchecked(self.len, PAGE)) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{align_of, offset_of, size_of};

    /// (C expression, value in Rust) pairs: sizes and offsets of every
    /// declared structure, as verbs.h must have them.
    fn abi_table() -> Vec<(&'static str, usize)> {
        macro_rules! size {
            ($c:literal, $t:ty) => {
                (concat!("sizeof(", $c, ")"), size_of::<$t>())
            };
        }
        macro_rules! off {
            ($c:literal, $t:ty, $($f:tt)+) => {
                (concat!("offsetof(", $c, ", ", stringify!($($f)+), ")"), offset_of!($t, $($f)+))
            };
        }
        vec![
            off!("struct ibv_context", ibv_context, ops),
            off!("struct ibv_context", ibv_context, ops.poll_cq),
            off!("struct ibv_context", ibv_context, ops.post_send),
            off!("struct ibv_context", ibv_context, cmd_fd),
            size!("struct ibv_context_ops", ibv_context_ops),
            size!("struct ibv_context", ibv_context),
            size!("struct ibv_cq", ibv_cq),
            off!("struct ibv_cq", ibv_cq, comp_events_completed),
            size!("struct ibv_qp", ibv_qp),
            off!("struct ibv_qp", ibv_qp, qp_num),
            off!("struct ibv_qp", ibv_qp, mutex),
            off!("struct ibv_qp", ibv_qp, events_completed),
            size!("struct ibv_mr", ibv_mr),
            off!("struct ibv_mr", ibv_mr, lkey),
            off!("struct ibv_mr", ibv_mr, rkey),
            size!("struct ibv_sge", ibv_sge),
            size!("struct ibv_send_wr", ibv_send_wr),
            off!("struct ibv_send_wr", ibv_send_wr, sg_list),
            off!("struct ibv_send_wr", ibv_send_wr, num_sge),
            off!("struct ibv_send_wr", ibv_send_wr, opcode),
            off!("struct ibv_send_wr", ibv_send_wr, send_flags),
            off!("struct ibv_send_wr", ibv_send_wr, imm_data),
            off!("struct ibv_send_wr", ibv_send_wr, wr.rdma.remote_addr),
            off!("struct ibv_send_wr", ibv_send_wr, wr.rdma.rkey),
            off!("struct ibv_send_wr", ibv_send_wr, wr.atomic.remote_addr),
            off!("struct ibv_send_wr", ibv_send_wr, wr.atomic.compare_add),
            off!("struct ibv_send_wr", ibv_send_wr, wr.atomic.swap),
            off!("struct ibv_send_wr", ibv_send_wr, wr.atomic.rkey),
            off!("struct ibv_send_wr", ibv_send_wr, qp_type),
            off!("struct ibv_send_wr", ibv_send_wr, bind_mw),
            size!("struct ibv_wc", ibv_wc),
            off!("struct ibv_wc", ibv_wc, status),
            off!("struct ibv_wc", ibv_wc, vendor_err),
            off!("struct ibv_wc", ibv_wc, qp_num),
            off!("struct ibv_wc", ibv_wc, wc_flags),
            off!("struct ibv_wc", ibv_wc, pkey_index),
            off!("struct ibv_wc", ibv_wc, dlid_path_bits),
            size!("union ibv_gid", ibv_gid),
            size!("struct ibv_global_route", ibv_global_route),
            off!("struct ibv_global_route", ibv_global_route, flow_label),
            off!("struct ibv_global_route", ibv_global_route, sgid_index),
            off!("struct ibv_global_route", ibv_global_route, traffic_class),
            size!("struct ibv_ah_attr", ibv_ah_attr),
            off!("struct ibv_ah_attr", ibv_ah_attr, dlid),
            off!("struct ibv_ah_attr", ibv_ah_attr, is_global),
            off!("struct ibv_ah_attr", ibv_ah_attr, port_num),
            size!("struct ibv_qp_cap", ibv_qp_cap),
            size!("struct ibv_qp_init_attr", ibv_qp_init_attr),
            off!("struct ibv_qp_init_attr", ibv_qp_init_attr, cap),
            off!("struct ibv_qp_init_attr", ibv_qp_init_attr, qp_type),
            off!("struct ibv_qp_init_attr", ibv_qp_init_attr, sq_sig_all),
            size!("struct ibv_qp_attr", ibv_qp_attr),
            off!("struct ibv_qp_attr", ibv_qp_attr, qkey),
            off!("struct ibv_qp_attr", ibv_qp_attr, rq_psn),
            off!("struct ibv_qp_attr", ibv_qp_attr, sq_psn),
            off!("struct ibv_qp_attr", ibv_qp_attr, dest_qp_num),
            off!("struct ibv_qp_attr", ibv_qp_attr, qp_access_flags),
            off!("struct ibv_qp_attr", ibv_qp_attr, cap),
            off!("struct ibv_qp_attr", ibv_qp_attr, ah_attr),
            off!("struct ibv_qp_attr", ibv_qp_attr, alt_ah_attr),
            off!("struct ibv_qp_attr", ibv_qp_attr, pkey_index),
            off!("struct ibv_qp_attr", ibv_qp_attr, max_rd_atomic),
            off!("struct ibv_qp_attr", ibv_qp_attr, max_dest_rd_atomic),
            off!("struct ibv_qp_attr", ibv_qp_attr, min_rnr_timer),
            off!("struct ibv_qp_attr", ibv_qp_attr, port_num),
            off!("struct ibv_qp_attr", ibv_qp_attr, timeout),
            off!("struct ibv_qp_attr", ibv_qp_attr, retry_cnt),
            off!("struct ibv_qp_attr", ibv_qp_attr, rnr_retry),
            off!("struct ibv_qp_attr", ibv_qp_attr, rate_limit),
            off!("struct ibv_port_attr", ibv_port_attr, active_mtu),
            off!("struct ibv_port_attr", ibv_port_attr, gid_tbl_len),
            off!("struct ibv_port_attr", ibv_port_attr, max_msg_sz),
            off!("struct ibv_port_attr", ibv_port_attr, lid),
            off!("struct ibv_port_attr", ibv_port_attr, link_layer),
            off!("struct ibv_port_attr", ibv_port_attr, port_cap_flags2),
            size!("struct ibv_device_attr", ibv_device_attr),
            off!("struct ibv_device_attr", ibv_device_attr, max_qp_wr),
            off!("struct ibv_device_attr", ibv_device_attr, max_cqe),
            off!("struct ibv_device_attr", ibv_device_attr, max_qp_rd_atom),
            off!("struct ibv_device_attr", ibv_device_attr, max_qp_init_rd_atom),
            off!("struct ibv_device_attr", ibv_device_attr, atomic_cap),
            off!("struct ibv_device_attr", ibv_device_attr, phys_port_cnt),
            ("IBV_WR_RDMA_WRITE", IBV_WR_RDMA_WRITE as usize),
            ("IBV_WR_RDMA_READ", IBV_WR_RDMA_READ as usize),
            ("IBV_WR_ATOMIC_FETCH_AND_ADD", IBV_WR_ATOMIC_FETCH_AND_ADD as usize),
            ("IBV_SEND_FENCE", IBV_SEND_FENCE as usize),
            ("IBV_SEND_SIGNALED", IBV_SEND_SIGNALED as usize),
            ("IBV_SEND_INLINE", IBV_SEND_INLINE as usize),
            ("IBV_ACCESS_LOCAL_WRITE", IBV_ACCESS_LOCAL_WRITE as usize),
            ("IBV_ACCESS_REMOTE_WRITE", IBV_ACCESS_REMOTE_WRITE as usize),
            ("IBV_ACCESS_REMOTE_READ", IBV_ACCESS_REMOTE_READ as usize),
            ("IBV_ACCESS_REMOTE_ATOMIC", IBV_ACCESS_REMOTE_ATOMIC as usize),
            ("IBV_QPS_INIT", IBV_QPS_INIT as usize),
            ("IBV_QPS_RTR", IBV_QPS_RTR as usize),
            ("IBV_QPS_RTS", IBV_QPS_RTS as usize),
            ("IBV_QPS_ERR", IBV_QPS_ERR as usize),
            ("IBV_QP_STATE", IBV_QP_STATE as usize),
            ("IBV_QP_ACCESS_FLAGS", IBV_QP_ACCESS_FLAGS as usize),
            ("IBV_QP_PKEY_INDEX", IBV_QP_PKEY_INDEX as usize),
            ("IBV_QP_PORT", IBV_QP_PORT as usize),
            ("IBV_QP_AV", IBV_QP_AV as usize),
            ("IBV_QP_PATH_MTU", IBV_QP_PATH_MTU as usize),
            ("IBV_QP_TIMEOUT", IBV_QP_TIMEOUT as usize),
            ("IBV_QP_RETRY_CNT", IBV_QP_RETRY_CNT as usize),
            ("IBV_QP_RNR_RETRY", IBV_QP_RNR_RETRY as usize),
            ("IBV_QP_RQ_PSN", IBV_QP_RQ_PSN as usize),
            ("IBV_QP_MAX_QP_RD_ATOMIC", IBV_QP_MAX_QP_RD_ATOMIC as usize),
            ("IBV_QP_MIN_RNR_TIMER", IBV_QP_MIN_RNR_TIMER as usize),
            ("IBV_QP_SQ_PSN", IBV_QP_SQ_PSN as usize),
            ("IBV_QP_MAX_DEST_RD_ATOMIC", IBV_QP_MAX_DEST_RD_ATOMIC as usize),
            ("IBV_QP_DEST_QPN", IBV_QP_DEST_QPN as usize),
            ("IBV_QPT_RC", IBV_QPT_RC as usize),
            ("IBV_ATOMIC_NONE", IBV_ATOMIC_NONE as usize),
            ("IBV_ATOMIC_GLOB", IBV_ATOMIC_GLOB as usize),
            ("IBV_PORT_ACTIVE", IBV_PORT_ACTIVE as usize),
            ("IBV_LINK_LAYER_ETHERNET", IBV_LINK_LAYER_ETHERNET as usize),
            ("IBV_WC_SUCCESS", IBV_WC_SUCCESS as usize),
            ("ENOSYS", libc_enosys() as usize),
        ]
    }

    #[test]
    fn layouts_on_lp64() {
        // Checked against rdma-core 44's verbs.h (x86-64); the test below
        // repeats the comparison against whatever header is installed.
        assert_eq!(size_of::<ibv_context_ops>(), 256);
        assert_eq!(size_of::<ibv_context>(), 328);
        assert_eq!(offset_of!(ibv_context, ops.poll_cq), 96);
        assert_eq!(offset_of!(ibv_context, ops.post_send), 208);
        assert_eq!(size_of::<ibv_send_wr>(), 128);
        assert_eq!(offset_of!(ibv_send_wr, wr.atomic.rkey), 64);
        assert_eq!(size_of::<ibv_wc>(), 48);
        assert_eq!(size_of::<ibv_qp_attr>(), 144);
        assert_eq!(size_of::<ibv_qp>(), 160);
        assert_eq!(offset_of!(ibv_qp, qp_num), 52);
        assert_eq!(size_of::<ibv_device_attr>(), 232);
        assert_eq!(offset_of!(ibv_port_attr, link_layer), 46);
        assert_eq!((size_of::<ibv_gid>(), align_of::<ibv_gid>()), (16, 8));
    }

    /// Compares every size, offset and constant above with the system's
    /// `<infiniband/verbs.h>`, compiled with the system C compiler. Skipped
    /// (with a note) when no header or compiler is installed; CI installs
    /// libibverbs-dev so that it runs there.
    #[test]
    fn abi_matches_verbs_h() {
        let header = std::path::Path::new("/usr/include/infiniband/verbs.h");
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
        if !header.exists() {
            eprintln!(
                "abi_matches_verbs_h: skipped, {} is not installed (apt-get install libibverbs-dev)",
                header.display()
            );
            return;
        }
        let table = abi_table();
        let mut c = String::from(
            "#include <infiniband/verbs.h>\n#include <stddef.h>\n#include <stdio.h>\n#include <errno.h>\nint main(void) {\n",
        );
        for (expr, _) in &table {
            c.push_str(&format!("    printf(\"%zu\\n\", (size_t)({expr}));\n"));
        }
        c.push_str("    return 0;\n}\n");
        let dir = std::env::temp_dir().join(format!("devcomm-verbs-abi-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let src = dir.join("abi.c");
        let exe = dir.join("abi");
        std::fs::write(&src, c).unwrap();
        let built = std::process::Command::new(&cc).arg(&src).arg("-o").arg(&exe).output();
        let built = match built {
            Ok(o) => o,
            Err(e) => {
                eprintln!("abi_matches_verbs_h: skipped, no C compiler ({cc}: {e})");
                return;
            }
        };
        assert!(built.status.success(), "compiling the ABI probe failed:\n{}", String::from_utf8_lossy(&built.stderr));
        let out = std::process::Command::new(&exe).output().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        let got: Vec<usize> = String::from_utf8(out.stdout).unwrap().lines().map(|l| l.parse().unwrap()).collect();
        assert_eq!(got.len(), table.len());
        let wrong: Vec<String> = table
            .iter()
            .zip(&got)
            .filter(|((_, rust), c)| rust != *c)
            .map(|((expr, rust), c)| format!("{expr}: Rust {rust}, C {c}"))
            .collect();
        assert!(wrong.is_empty(), "layouts differ from verbs.h:\n{}", wrong.join("\n"));
    }

    #[test]
    fn missing_library_is_unavailable() {
        let e = Verbs::load("libdevcomm-no-such-ibverbs.so.1").unwrap_err();
        match e {
            GinHostError::Unavailable(m) => {
                assert!(m.contains("libdevcomm-no-such-ibverbs.so.1") && m.contains("libibverbs"), "{m}")
            }
            e => panic!("{e:?}"),
        }
    }

    #[test]
    fn host_buffers() {
        let mut b = HostBuf::new(100).unwrap();
        assert_eq!((b.len(), b.addr() % 4096), (4096, 0));
        // SAFETY: in bounds, no NIC involved.
        unsafe { b.slice_mut(8, 8) }.copy_from_slice(&7u64.to_ne_bytes());
        assert_eq!((b.load_word(0), b.load_word(1)), (0, 7));
    }
}
