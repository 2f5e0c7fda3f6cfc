//! Tests of the verbs transport's logic that runs without a NIC, and of the
//! way it fails where libibverbs or a device is missing.

use super::*;
use std::sync::Mutex;

#[test]
fn default_config_is_valid() {
    let c = VerbsConfig::default();
    c.validate().unwrap();
    assert_eq!(c.library, "libibverbs.so.1");
    assert!(c.flush_before_signal);
    assert_eq!(VerbsConfig::from_vars(|_| None).unwrap(), c);
}

#[test]
fn config_from_variables() {
    let vars = |k: &str| match k {
        ENV_HCA => Some("mlx5_2:2".to_string()),
        ENV_GID_INDEX => Some(" 3 ".to_string()),
        ENV_TC => Some("106".to_string()),
        ENV_SL => Some("5".to_string()),
        ENV_TIMEOUT => Some("18".to_string()),
        ENV_FLUSH => Some("0".to_string()),
        _ => None,
    };
    let c = VerbsConfig::from_vars(vars).unwrap();
    assert_eq!((c.device.as_deref(), c.port, c.gid_index), (Some("mlx5_2"), 2, 3));
    assert_eq!((c.traffic_class, c.service_level, c.ack_timeout, c.flush_before_signal), (106, 5, 18, false));
    for (k, v) in [
        (ENV_HCA, ""),
        (ENV_HCA, "mlx5_0:0"),
        (ENV_HCA, "mlx5_0:x"),
        (ENV_HCA, "mlx5_0,mlx5_1"),
        (ENV_GID_INDEX, "256"),
        (ENV_GID_INDEX, "-1"),
        (ENV_SL, "16"),
        (ENV_TIMEOUT, "32"),
        (ENV_FLUSH, "2"),
        (ENV_TC, "x"),
    ] {
        let r = VerbsConfig::from_vars(|q| (q == k).then(|| v.to_string()));
        match r {
            Err(GinHostError::Invalid(m)) => assert!(m.contains(k), "{k}={v}: {m}"),
            r => panic!("{k}={v:?} accepted: {r:?}"),
        }
    }
}

#[test]
fn hca_parsing() {
    assert_eq!(parse_hca("mlx5_0").unwrap(), ("mlx5_0".to_string(), None));
    assert_eq!(parse_hca(" mlx5_1:2 ").unwrap(), ("mlx5_1".to_string(), Some(2)));
    assert!(parse_hca(":1").is_err());
    assert!(parse_hca("a b").is_err());
}

#[test]
fn config_validation() {
    let ok = VerbsConfig::default();
    let bad = [
        VerbsConfig { port: 0, ..ok.clone() },
        VerbsConfig { send_queue_depth: 1, ..ok.clone() },
        VerbsConfig { signal_interval: 0, ..ok.clone() },
        VerbsConfig { staging_piece: 0, ..ok.clone() },
        VerbsConfig { staging_bytes: 1 << 20, staging_piece: (1 << 19) + 1, ..ok.clone() },
        VerbsConfig { retry_count: 8, ..ok.clone() },
        VerbsConfig { ack_timeout: 32, ..ok.clone() },
    ];
    for c in bad {
        assert!(matches!(c.validate(), Err(GinHostError::Invalid(_))), "{c:?}");
    }
}

fn info(rank: u32, nranks: u32, link_layer: u8) -> ConnInfo {
    ConnInfo {
        rank,
        nranks,
        lid: 100 + rank as u16,
        port: 1,
        link_layer,
        mtu: if rank == 0 { 5 } else { 3 },
        gid_index: 0,
        gid: [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, rank as u8],
        signals_addr: 0x1000 * (rank as u64 + 1),
        signals_rkey: 10 + rank,
        total_signals: 8,
        control_addr: 0x9000,
        control_rkey: 20 + rank,
        // QP of `rank` toward peer p: number rank*16 + p, PSN rank*256 + p.
        qps: (0..nranks).map(|p| QpEndpoint { qpn: rank * 16 + p, psn: rank * 256 + p }).collect(),
        windows: vec![WindowInfo { id: 0, rkey: 30 + rank, addr: 0x10_0000, len: 4096 }],
    }
}

fn records(infos: &[ConnInfo]) -> Vec<Vec<u8>> {
    infos.iter().map(|c| conninfo::encode(&ConnRecord::Ready(c.clone()))).collect()
}

#[test]
fn merging_records() {
    let infos = vec![info(0, 3, 1), info(1, 3, 1), info(2, 3, 1)];
    let r = records(&infos);
    assert_eq!(merge_records(1, 3, &r).unwrap(), infos);
    // Wrong count.
    assert!(matches!(merge_records(1, 3, &r[..2]), Err(GinHostError::Invalid(_))));
    // A peer that failed: Remote, naming it and its reason.
    let mut f = r.clone();
    f[2] = conninfo::encode(&ConnRecord::Failed("rank 2: GIN backend unavailable: no RDMA device".into()));
    match merge_records(1, 3, &f) {
        Err(GinHostError::Remote(m)) => assert!(m.contains("rank 2") && m.contains("no RDMA device"), "{m}"),
        r => panic!("{r:?}"),
    }
    // This rank's own failure record: Unavailable.
    assert!(matches!(merge_records(2, 3, &f), Err(GinHostError::Unavailable(_))));
    // Garbage.
    let mut g = r.clone();
    g[0] = b"hello".to_vec();
    assert!(matches!(merge_records(1, 3, &g), Err(GinHostError::Invalid(_))));
    // Records out of place, or for another communicator size.
    let mut s = r.clone();
    s.swap(0, 1);
    assert!(matches!(merge_records(1, 3, &s), Err(GinHostError::Invalid(_))));
    let other = records(&[info(0, 2, 1), info(1, 2, 1)]);
    assert!(merge_records(1, 3, &[other[0].clone(), other[1].clone(), r[2].clone()]).is_err());
    // InfiniBand and RoCE ports cannot talk.
    let mixed = records(&[info(0, 2, 1), info(1, 2, 2)]);
    match merge_records(0, 2, &mixed) {
        Err(GinHostError::Invalid(m)) => assert!(m.contains("RoCE"), "{m}"),
        r => panic!("{r:?}"),
    }
    // Unspecified link layer counts as InfiniBand.
    assert!(merge_records(0, 2, &records(&[info(0, 2, 0), info(1, 2, 1)])).is_ok());
}

#[test]
fn queue_pair_attributes_cross_between_ranks() {
    let cfg = VerbsConfig { service_level: 3, traffic_class: 7, gid_index: 2, ..Default::default() };
    let (me, peer) = (info(0, 2, 1), info(1, 2, 1));
    let rtr = rtr_params(&me, &peer, &cfg, 32);
    // Rank 0's QP toward rank 1 talks to rank 1's QP toward rank 0, starting
    // at the PSN that one sends with.
    assert_eq!((rtr.dest_qpn, rtr.rq_psn), (peer.qps[0].qpn, peer.qps[0].psn));
    assert_eq!((rtr.dest_qpn, rtr.rq_psn), (16, 256));
    assert_eq!((rtr.dlid, rtr.sl, rtr.port), (101, 3, 1));
    assert_eq!(rtr.mtu, 3); // the smaller of the two
    assert_eq!(rtr.grh, None); // InfiniBand, same subnet
    assert_eq!(rtr.max_dest_rd_atomic, 16);
    let rts = rts_params(&me, 1, &cfg, 0);
    assert_eq!(rts.sq_psn, me.qps[1].psn);
    assert_eq!((rts.timeout, rts.retry_cnt, rts.rnr_retry, rts.max_rd_atomic), (20, 7, 7, 1));
    // The other side agrees: what 1 expects from 0 is what 0 sends with.
    let back = rtr_params(&peer, &me, &cfg, 4);
    assert_eq!((back.dest_qpn, back.rq_psn), (me.qps[1].qpn, rts.sq_psn));
    assert_eq!(back.max_dest_rd_atomic, 4);
    // Loopback: rank 0's QP to itself.
    let lo = rtr_params(&me, &me, &cfg, 1);
    assert_eq!((lo.dest_qpn, lo.rq_psn), (me.qps[0].qpn, me.qps[0].psn));
    // RoCE: always a GRH, with the peer's GID, our GID index and class.
    let (me_e, peer_e) = (info(0, 2, 2), info(1, 2, 2));
    let g = rtr_params(&me_e, &peer_e, &cfg, 1).grh.unwrap();
    assert_eq!((g.dgid, g.sgid_index, g.traffic_class, g.hop_limit), (peer_e.gid, 2, 7, 255));
    // InfiniBand across subnets (GID prefixes differ): a GRH too.
    let mut far = info(1, 2, 1);
    far.gid[7] = 1;
    assert!(rtr_params(&me, &far, &cfg, 1).grh.is_some());
}

#[test]
fn ready_statuses() {
    let ok: GinResult<()> = Ok(());
    let bad: GinResult<()> = Err(GinHostError::System("ibv_modify_qp(RTR): Invalid argument".into()));
    let statuses = vec![ready_record(&ok), ready_record(&bad), ready_record(&ok)];
    assert!(statuses[0].is_empty());
    match check_ready(0, &statuses, Ok(())) {
        Err(GinHostError::Remote(m)) => assert!(m.contains("rank 1") && m.contains("RTR"), "{m}"),
        r => panic!("{r:?}"),
    }
    assert!(matches!(check_ready(1, &statuses, bad.clone()), Err(GinHostError::System(_))));
    assert!(check_ready(0, &[Vec::new(), Vec::new()], Ok(())).is_ok());
    assert!(check_ready(0, &[Vec::new(), b"junk".to_vec()], Ok(())).is_err());
}

#[test]
fn host_ranges() {
    let d = [1u8, 2, 3, 4];
    assert_eq!(host_range(&d, 1, 2).unwrap(), &[2, 3]);
    assert!(host_range(&d, 3, 2).is_err());
    assert!(host_range(&d, u64::MAX, 1).is_err());
}

/// A bootstrap of `n` ranks where the other ranks' records are given.
struct FakeBoot {
    rank: usize,
    others: Vec<Vec<u8>>,
    calls: Mutex<Vec<Vec<u8>>>,
}

impl Bootstrap for FakeBoot {
    fn rank(&self) -> usize {
        self.rank
    }
    fn nranks(&self) -> usize {
        self.others.len() + 1
    }
    fn allgather(&self, data: &[u8]) -> GinResult<Vec<Vec<u8>>> {
        self.calls.lock().unwrap().push(data.to_vec());
        let mut all = self.others.clone();
        all.insert(self.rank, data.to_vec());
        Ok(all)
    }
}

fn no_library() -> VerbsConfig {
    VerbsConfig { library: "libdevcomm-no-such-ibverbs.so.1".into(), ..Default::default() }
}

#[test]
fn missing_library_is_unavailable_and_still_collective() {
    let mut signals = vec![0u64; 4];
    let mem = VerbsMemory { windows: vec![], signals: signals.as_mut_ptr(), total_signals: 4 };
    // The peer's record (ready) is what it would send.
    let boot = FakeBoot { rank: 0, others: records(&[info(1, 2, 1)]), calls: Mutex::new(vec![]) };
    // SAFETY: `signals` outlives the call (which fails before registering).
    let e = unsafe { VerbsTransport::connect(&boot, &mem, &no_library()) }.unwrap_err();
    match e {
        GinHostError::Unavailable(m) => assert!(m.contains("libdevcomm-no-such-ibverbs.so.1"), "{m}"),
        e => panic!("{e:?}"),
    }
    // It took part in the exchange, with a failure record that names it.
    let calls = boot.calls.lock().unwrap();
    assert_eq!(calls.len(), 1);
    match conninfo::decode(&calls[0]).unwrap() {
        ConnRecord::Failed(m) => assert!(m.starts_with("rank 0: GIN backend unavailable:"), "{m}"),
        r => panic!("{r:?}"),
    }
    assert!(matches!(devices(&no_library()), Err(GinHostError::Unavailable(_))));
}

#[test]
fn bad_bootstrap_rank_is_invalid() {
    struct Bad;
    impl Bootstrap for Bad {
        fn rank(&self) -> usize {
            2
        }
        fn nranks(&self) -> usize {
            2
        }
        fn allgather(&self, _: &[u8]) -> GinResult<Vec<Vec<u8>>> {
            unreachable!()
        }
    }
    let mem = VerbsMemory { windows: vec![], signals: std::ptr::null_mut(), total_signals: 0 };
    // SAFETY: no memory named.
    let r = unsafe { VerbsTransport::connect(&Bad, &mem, &VerbsConfig::default()) };
    assert!(matches!(r, Err(GinHostError::Invalid(_))));
}

/// A single-rank bootstrap.
struct Solo;

impl Bootstrap for Solo {
    fn rank(&self) -> usize {
        0
    }
    fn nranks(&self) -> usize {
        1
    }
    fn allgather(&self, data: &[u8]) -> GinResult<Vec<Vec<u8>>> {
        Ok(vec![data.to_vec()])
    }
}

/// Where the machine has no RDMA device (all of the project's machines):
/// `Unavailable` with a message saying so. Where one exists (or soft-RoCE
/// is set up), a real end-to-end run over the loopback queue pair: puts
/// (inline, staged, split), signals after them, and a graceful close.
#[test]
fn loopback_put_and_signal_when_a_device_exists() {
    let config = VerbsConfig::from_env().unwrap();
    let mut window = vec![0u8; 1 << 16];
    let mut signals = vec![0u64; 4];
    let mem = VerbsMemory {
        windows: vec![VerbsWindow { id: 5, addr: window.as_mut_ptr() as u64, len: window.len() as u64, dmabuf: None }],
        signals: signals.as_mut_ptr(),
        total_signals: 4,
    };
    // SAFETY: `window` and `signals` outlive the transport (dropped at the
    // end of the test, after it); signals are read atomically below.
    let t = unsafe { VerbsTransport::connect(&Solo, &mem, &config) };
    let mut t = match t {
        Err(GinHostError::Unavailable(m)) => {
            eprintln!("no RDMA device here: {m}");
            assert!(
                m.contains("libibverbs") || m.contains("RDMA") || m.contains("port"),
                "unclear Unavailable message: {m}"
            );
            return;
        }
        Err(e) => panic!("connect failed: {e}"),
        Ok(t) => t,
    };
    eprintln!("RDMA device {} found: running the loopback test", t.device_name());
    let small = [7u8; 16];
    let big: Vec<u8> = (0..40_000u32).map(|i| (i % 251) as u8).collect();
    t.put(PutTarget::new(0, 5, 0, Some((1, 1))), &small).unwrap();
    t.put(PutTarget::new(0, 5, 1000, None), &big).unwrap();
    t.signal(0, 2, 5).unwrap();
    assert!(matches!(t.put(PutTarget::new(0, 5, (1 << 16) - 8, None), &small), Err(GinHostError::Invalid(_))));
    assert!(matches!(t.put(PutTarget::new(0, 6, 0, None), &small), Err(GinHostError::Invalid(_))));
    assert!(matches!(t.signal(0, 4, 1), Err(GinHostError::Invalid(_))));
    t.flush().unwrap();
    let mut failed = vec![];
    t.progress(&mut failed).unwrap();
    assert!(failed.is_empty(), "{failed:?}");
    let sig = |i: usize| {
        // SAFETY: in bounds; the NIC writes these words, we read atomically.
        unsafe { std::sync::atomic::AtomicU64::from_ptr(signals.as_ptr().add(i) as *mut u64) }
            .load(std::sync::atomic::Ordering::Acquire)
    };
    assert_eq!((sig(1), sig(2)), (1, 5));
    drop(t);
    assert_eq!(&window[..16], &small);
    assert_eq!(&window[1000..1000 + big.len()], &big[..]);
}

// ---- the executor against a software model of a NIC ----

use model::{Fabric, Knobs, ModelNic};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

const WINDOW: u32 = 5;
const WINDOW_BYTES: usize = 1 << 18;

/// One rank of a model test: its memory (which outlives its transport) and knobs.
struct ModelRank {
    window: Box<[u8]>,
    signals: Box<[u64]>,
    knobs: Arc<Knobs>,
    window_lkey: u32,
}

fn model_config() -> VerbsConfig {
    VerbsConfig {
        send_queue_depth: 8,
        signal_interval: 4,
        staging_bytes: 64 << 10,
        staging_piece: 16 << 10,
        wait_timeout: Duration::from_secs(20),
        ..VerbsConfig::default()
    }
}

/// `nranks` ranks connected through model NICs.
fn model_world(nranks: usize, config: &VerbsConfig) -> (Vec<ModelRank>, Vec<VerbsTransport>) {
    let fabric = Fabric::new();
    let mut ranks = Vec::new();
    let mut bufs = Vec::new();
    let mut infos = Vec::new();
    for r in 0..nranks {
        let nic = ModelNic::new(&fabric, "model", config.send_queue_depth, 64, nranks);
        let mut rank = ModelRank {
            window: vec![0u8; WINDOW_BYTES].into_boxed_slice(),
            signals: vec![0u64; 4].into_boxed_slice(),
            knobs: nic.knobs(),
            window_lkey: 1000 + r as u32,
        };
        let staging = ffi::HostBuf::new(config.staging_bytes).unwrap();
        let scratch = new_scratch().unwrap();
        let control = ffi::HostBuf::new(8 * nranks).unwrap();
        let key = |k: u32| 100 * (r as u32 + 1) + k;
        let w = (rank.window.as_mut_ptr() as u64, WINDOW_BYTES as u64);
        fabric.add_rkey(&nic, key(1), w.0, w.1);
        fabric.add_lkey(&nic, rank.window_lkey, w.0, w.1);
        fabric.add_rkey(&nic, key(2), rank.signals.as_mut_ptr() as u64, 32);
        fabric.add_rkey(&nic, key(3), control.addr(), control.len() as u64);
        fabric.add_lkey(&nic, key(4), staging.addr(), staging.len() as u64);
        fabric.add_lkey(&nic, key(5), scratch.addr(), scratch.len() as u64);
        infos.push(ConnInfo {
            rank: r as u32,
            nranks: nranks as u32,
            lid: 1,
            port: 1,
            link_layer: 1,
            mtu: 5,
            gid_index: 0,
            gid: [0; 16],
            signals_addr: rank.signals.as_mut_ptr() as u64,
            signals_rkey: key(2),
            total_signals: 4,
            control_addr: control.addr(),
            control_rkey: key(3),
            qps: vec![QpEndpoint::default(); nranks],
            windows: vec![WindowInfo {
                id: WINDOW,
                rkey: key(1),
                addr: rank.window.as_mut_ptr() as u64,
                len: WINDOW_BYTES as u64,
            }],
        });
        bufs.push((nic, staging, scratch, control, key(4), key(5)));
        ranks.push(rank);
    }
    let mut ts = Vec::new();
    for (r, (nic, staging_buf, scratch, control, staging_lkey, scratch_lkey)) in bufs.into_iter().enumerate() {
        let parts = Parts {
            nic: Box::new(nic),
            staging_buf,
            scratch,
            control,
            staging_lkey,
            scratch_lkey,
            rank: r,
            qps: (0..nranks).collect(),
            depth: config.send_queue_depth,
            max_inline: 64,
            max_msg: 1 << 30,
            local_windows: vec![(ranks[r].window.as_ptr() as u64, WINDOW_BYTES as u64, ranks[r].window_lkey)],
            atomics_global: false,
        };
        ts.push(VerbsTransport::assemble(parts, &infos, config));
    }
    (ranks, ts)
}

fn signal(r: &ModelRank, i: usize) -> u64 {
    // SAFETY: in bounds; the model NIC updates these words atomically.
    unsafe { AtomicU64::from_ptr(r.signals.as_ptr().add(i) as *mut u64) }.load(Ordering::SeqCst)
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

#[test]
fn model_puts_and_signals_land_in_order() {
    let config = model_config();
    let (ranks, mut ts) = model_world(2, &config);
    let small = pattern(40, 1);
    let big = pattern(150_000, 2); // > the 64 KiB staging ring: staged in 16 KiB pieces, waiting for room
    ts[0].put(PutTarget::new(1, WINDOW, 8, Some((0, 1))), &small).unwrap();
    ts[0].put(PutTarget::new(1, WINDOW, 4096, Some((1, 7))), &big).unwrap();
    ts[0].signal(1, 2, 3).unwrap();
    ts[0].put(PutTarget::new(0, WINDOW, 0, Some((3, 2))), &small).unwrap(); // loopback to itself
    ts[0].flush().unwrap();
    assert_eq!(&ranks[1].window[8..48], &small[..]);
    assert_eq!(&ranks[1].window[4096..4096 + big.len()], &big[..]);
    assert_eq!((signal(&ranks[1], 0), signal(&ranks[1], 1), signal(&ranks[1], 2)), (1, 7, 3));
    assert_eq!((&ranks[0].window[..40], signal(&ranks[0], 3)), (&small[..], 2));
    let mut failed = vec![];
    ts[0].progress(&mut failed).unwrap();
    assert!(failed.is_empty());
    // What went on the wire to rank 1: the inline write, the flush read of
    // it, the fenced atomic; then 10 staged writes (each signaled: its slot
    // is freed by its completion), the flush read of the last one, the
    // fenced atomic; then a fenced atomic alone (nothing unflushed before it).
    let log = ranks[0].knobs.log.lock().unwrap();
    let to1: Vec<(WrOpcode, bool, bool, bool)> =
        log.iter().filter(|(qp, _)| *qp == 1).map(|(_, w)| (w.opcode, w.inline, w.fence, w.signaled)).collect();
    use WrOpcode::*;
    let atomic = (AtomicFetchAdd, false, true, true);
    let read = (RdmaRead, false, false, false);
    assert_eq!(to1[..3], [(RdmaWrite, true, false, false), read, atomic]);
    assert!(to1[3..13].iter().all(|&w| w == (RdmaWrite, false, false, true)), "{to1:?}");
    assert_eq!(to1[13..], [read, atomic, atomic]);
    // The flush read reads back the last bytes written, into the scratch word.
    let reads: Vec<&ffi::PostWr> = log.iter().filter(|(_, w)| w.opcode == RdmaRead).map(|(_, w)| w).collect();
    let last_write =
        log.iter().filter(|(qp, w)| *qp == 1 && w.opcode == RdmaWrite).map(|(_, w)| w).next_back().unwrap();
    assert_eq!((reads[1].remote_addr, reads[1].rkey), (last_write.remote_addr, last_write.rkey));
    drop(log);
    drop(ts);
    drop(ranks);
}

#[test]
fn model_send_queue_full_waits_and_never_overflows() {
    // Depth 8 and a NIC that hands out one completion per poll: 500 small
    // puts (one inline write each) all land; the model refuses any post
    // beyond the depth, which would fail the peer and lose data.
    let config = VerbsConfig { signal_interval: 8, ..model_config() };
    let (ranks, mut ts) = model_world(2, &config);
    ranks[0].knobs.per_poll.store(1, Ordering::SeqCst);
    for i in 0..500u64 {
        ts[0].put(PutTarget::new(1, WINDOW, 8 * i, None), &i.to_le_bytes()).unwrap();
    }
    ts[0].signal(1, 0, 1).unwrap();
    ts[0].flush().unwrap();
    for i in 0..500usize {
        assert_eq!(u64::from_le_bytes(ranks[1].window[8 * i..8 * i + 8].try_into().unwrap()), i as u64);
    }
    assert_eq!(signal(&ranks[1], 0), 1);
    drop(ts);
}

struct HostMemory;

impl LocalMemory for HostMemory {
    fn window_addr(&self, _: u32, _: u64, _: u64) -> GinResult<u64> {
        unreachable!()
    }
    fn write_device(&self, _: u64, _: &[u8]) -> GinResult<()> {
        unreachable!()
    }
    fn read_device(&self, addr: u64, out: &mut [u8]) -> GinResult<()> {
        // SAFETY: the tests pass addresses of live host buffers of this length.
        unsafe { std::ptr::copy(addr as *const u8, out.as_mut_ptr(), out.len()) };
        Ok(())
    }
}

#[test]
fn model_zero_copy_puts_retire_on_completion() {
    let config = model_config();
    let (mut ranks, mut ts) = model_world(2, &config);
    let data = pattern(100_000, 9);
    ranks[0].window[..data.len()].copy_from_slice(&data);
    let src = ranks[0].window.as_ptr() as u64;
    // The NIC stalls: the put is posted (zero copy, from the window's MR) but
    // not retired, so the proxy would not complete its ticket yet.
    ranks[0].knobs.per_poll.store(0, Ordering::SeqCst);
    let mut buf = Vec::new();
    assert_eq!(ts[0].issued(), 0);
    ts[0]
        .put_from_device(&HostMemory, PutTarget::new(1, WINDOW, 64, Some((0, 1))), src, data.len() as u64, &mut buf)
        .unwrap();
    assert_eq!((ts[0].issued(), ts[0].retired().unwrap()), (1, 0));
    {
        let log = ranks[0].knobs.log.lock().unwrap();
        let (_, w) = log[0];
        assert_eq!((w.opcode, w.sge, w.inline), (WrOpcode::RdmaWrite, (src, 100_000, ranks[0].window_lkey), false));
    }
    ranks[0].knobs.per_poll.store(usize::MAX, Ordering::SeqCst);
    assert_eq!(ts[0].retired().unwrap(), 1);
    assert_eq!(&ranks[1].window[64..64 + data.len()], &data[..]);
    assert_eq!(signal(&ranks[1], 0), 1);
    // A source outside the registered windows is read into staging instead
    // (consumed at once: no new mark).
    let outside = pattern(30_000, 4);
    ts[0]
        .put_from_device(&HostMemory, PutTarget::new(1, WINDOW, 0, None), outside.as_ptr() as u64, 30_000, &mut buf)
        .unwrap();
    assert_eq!((ts[0].issued(), ts[0].retired().unwrap()), (1, 1));
    ts[0].flush().unwrap();
    assert_eq!(&ranks[1].window[..30_000], &outside[..]);
    drop(ts);
}

#[test]
fn model_failed_peer_is_reported_once_and_refused() {
    let config = model_config();
    let (ranks, mut ts) = model_world(3, &config);
    ranks[0].knobs.broken.lock().unwrap()[2] = true;
    // Posting succeeds; the failure comes back as a completion error.
    ts[0].put(PutTarget::new(2, WINDOW, 0, Some((0, 1))), &[1; 8]).unwrap();
    ts[0].put(PutTarget::new(1, WINDOW, 0, None), &[2; 8]).unwrap();
    ts[0].flush().unwrap();
    let mut failed = vec![];
    ts[0].progress(&mut failed).unwrap();
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0].peer, 2);
    match &failed[0].error {
        GinHostError::Remote(m) => assert!(m.contains("rank 2") && m.contains("retry counter exceeded"), "{m}"),
        e => panic!("{e:?}"),
    }
    assert!(matches!(ts[0].put(PutTarget::new(2, WINDOW, 0, None), &[1; 8]), Err(GinHostError::Remote(_))));
    assert!(matches!(ts[0].signal(2, 0, 1), Err(GinHostError::Remote(_))));
    ts[0].progress(&mut failed).unwrap();
    assert_eq!(failed.len(), 1, "reported once");
    // The others are unaffected.
    ts[0].put(PutTarget::new(1, WINDOW, 8, Some((1, 1))), &[3; 8]).unwrap();
    ts[0].flush().unwrap();
    assert_eq!(
        (&ranks[1].window[..16], signal(&ranks[1], 1)),
        (&[2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3][..], 1)
    );
    // A request past the peer's window is refused locally (Invalid), and
    // the peer stays up.
    assert!(matches!(
        ts[0].put(PutTarget::new(1, WINDOW, WINDOW_BYTES as u64 - 4, None), &[0; 8]),
        Err(GinHostError::Invalid(_))
    ));
    assert!(matches!(ts[0].put(PutTarget::new(1, 99, 0, None), &[0; 8]), Err(GinHostError::Invalid(_))));
    ts[0].put(PutTarget::new(1, WINDOW, 0, None), &[4; 8]).unwrap();
    drop(ts);
}

#[test]
fn model_stalled_peer_is_failed_after_the_wait_timeout() {
    let config = VerbsConfig { wait_timeout: Duration::from_millis(100), ..model_config() };
    let (ranks, mut ts) = model_world(2, &config);
    ranks[0].knobs.per_poll.store(0, Ordering::SeqCst);
    ts[0].put(PutTarget::new(1, WINDOW, 0, None), &[1; 8]).unwrap();
    // flush gives up on rank 1 (fails it) instead of hanging.
    ts[0].flush().unwrap();
    let mut failed = vec![];
    ts[0].progress(&mut failed).unwrap();
    assert_eq!(failed.iter().map(|f| f.peer).collect::<Vec<_>>(), vec![1]);
    assert!(matches!(ts[0].put(PutTarget::new(1, WINDOW, 0, None), &[1; 8]), Err(GinHostError::Remote(_))));
    drop(ts);
}

#[test]
fn model_graceful_close_is_not_a_failure() {
    let config = model_config();
    let (ranks, mut ts) = model_world(2, &config);
    ts[1].close(true);
    // Rank 1 wrote its goodbye into rank 0's control word for it.
    match ts[0].put(PutTarget::new(1, WINDOW, 0, None), &[1; 8]) {
        Err(GinHostError::Remote(m)) => assert!(m.contains("closed"), "{m}"),
        r => panic!("{r:?}"),
    }
    let mut failed = vec![];
    ts[0].progress(&mut failed).unwrap();
    assert!(failed.is_empty());
    // A closed transport refuses work and its QPs are in the error state.
    assert!(matches!(ts[1].put(PutTarget::new(0, WINDOW, 0, None), &[1; 8]), Err(GinHostError::Invalid(_))));
    // An abort (not graceful) says nothing: the peer sees a failure later.
    let (ranks2, mut ts2) = model_world(2, &config);
    ts2[1].close(false);
    ranks2[0].knobs.broken.lock().unwrap()[1] = true; // its QP is gone
    ts2[0].put(PutTarget::new(1, WINDOW, 0, None), &[1; 8]).unwrap();
    ts2[0].flush().unwrap();
    ts2[0].progress(&mut failed).unwrap();
    assert_eq!(failed.len(), 1);
    drop(ts);
    drop(ts2);
    drop((ranks, ranks2));
}

#[test]
fn model_gets_read_into_the_window_and_retire_on_completion() {
    let config = model_config();
    let (mut ranks, mut ts) = model_world(2, &config);
    let data = pattern(70_000, 5);
    ranks[1].window[1000..1000 + data.len()].copy_from_slice(&data);
    ranks[0].window[..80_000].fill(0xEE);
    let dst = ranks[0].window.as_ptr() as u64 + 7;
    // The NIC stalls completions: the reads are posted, the get not retired.
    ranks[0].knobs.per_poll.store(0, Ordering::SeqCst);
    ts[0].get(GetSource { peer: 1, src_window: WINDOW, src_offset: 1000 }, dst, data.len() as u64).unwrap();
    assert_eq!((ts[0].issued(), ts[0].retired().unwrap()), (1, 0));
    {
        let log = ranks[0].knobs.log.lock().unwrap();
        let reads: Vec<_> = log.iter().filter(|(qp, w)| *qp == 1 && w.opcode == WrOpcode::RdmaRead).collect();
        assert_eq!(reads.len(), 1);
        assert_eq!((reads[0].1.sge, reads[0].1.signaled), ((dst, 70_000, ranks[0].window_lkey), true));
    }
    ranks[0].knobs.per_poll.store(usize::MAX, Ordering::SeqCst);
    assert_eq!(ts[0].retired().unwrap(), 1);
    assert_eq!(&ranks[0].window[7..7 + data.len()], &data[..]);
    assert!(ranks[0].window[..7].iter().chain(&ranks[0].window[7 + data.len()..80_000]).all(|&b| b == 0xEE));
    // Refused: a destination outside the registered windows, a range past the
    // peer's window, a get from oneself overlapping its destination.
    let outside = [0u8; 16];
    let from1 = GetSource { peer: 1, src_window: WINDOW, src_offset: 0 };
    assert!(matches!(ts[0].get(from1, outside.as_ptr() as u64, 16), Err(GinHostError::Invalid(_))));
    let past = GetSource { peer: 1, src_window: WINDOW, src_offset: WINDOW_BYTES as u64 - 4 };
    assert!(matches!(ts[0].get(past, dst, 8), Err(GinHostError::Invalid(_))));
    let own = GetSource { peer: 0, src_window: WINDOW, src_offset: 0 };
    assert!(matches!(ts[0].get(own, dst, 16), Err(GinHostError::Invalid(_))));
    // From oneself, disjoint: through the loopback queue pair.
    ranks[0].window[200_000..200_100].copy_from_slice(&pattern(100, 8));
    let own = GetSource { peer: 0, src_window: WINDOW, src_offset: 200_000 };
    ts[0].get(own, ranks[0].window.as_ptr() as u64 + 100_000, 100).unwrap();
    ts[0].flush().unwrap();
    assert_eq!(ts[0].retired().unwrap(), 2);
    assert_eq!(&ranks[0].window[100_000..100_100], &pattern(100, 8)[..]);
    drop(ts);
}
