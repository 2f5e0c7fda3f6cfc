//! Host collectives (`devcomm::coll`) across ranks in separate processes:
//! every collective × datatype × reduction against a host reference (f64
//! for floats, exact wrapping arithmetic for integers), outputs poisoned
//! beforehand and the elements around them checked; sizes 0, 1, odd, not a
//! multiple of 16 bytes, and many chunks (the scratch is made tiny so that
//! every path runs at small sizes: LL, one-shot, two-shot, chunked staging,
//! several CTAs); device buffers and windows (zero copy), in place and out
//! of place; bad input; mismatched arguments in checking mode.
//!
//! Runs on the runtime `DEVCOMM_RUNTIME` names (default emulated) with 1,
//! 2, 3, 4 and 8 ranks; on CUDA ranks share the GPUs there are.

mod common;

use common::is_child;
use devcomm::coll::{Algorithm, CollConfig, CollType, Collectives, Fp8E4M3, Fp8E5M2, MultiTeam, Op, Operand};
use devcomm::comm::Communicator;
use devcomm::memory::SymmetricMemory;
use devcomm::runtime::LaunchConfig;
use devcomm::runtime::{DeviceBuffer, Stream};
use devcomm::window::Window;
use devcomm::{Error, WindowFlags};
use devcomm_device::coll::{CollArgs, CollBuffer, RedOp};
use devcomm_device::comm::WindowDesc;
use half::{bf16, f16};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Elements of poison kept on each side of every output.
const GUARD: usize = 5;
const POISON: u8 = 0xA5;

/// An element type with its test data, reference and tolerance.
trait TestElem: CollType {
    /// Integers: exact wrapping references.
    const INT: bool;
    /// Relative tolerance of a float result (unused for integers).
    const EPS: f64;
    /// A random value (`prod`: near 1, so products stay in range).
    fn random(rng: &mut StdRng, prod: bool) -> Self;
    /// As `i128` (integers).
    fn to_i128(self) -> i128 {
        self.to_f64() as i128
    }
    /// `v` wrapped into the type (integers).
    fn wrap(v: i128) -> Self {
        Self::from_f64(v as f64)
    }
}

macro_rules! int_elem {
    ($($t:ty),*) => {$(
        impl TestElem for $t {
            const INT: bool = true;
            const EPS: f64 = 0.0;
            fn random(rng: &mut StdRng, prod: bool) -> Self {
                if prod { rng.gen_range(0..4) as $t } else { rng.gen() }
            }
            fn to_i128(self) -> i128 { self as i128 }
            fn wrap(v: i128) -> Self { v as $t }
        }
    )*};
}
int_elem!(i8, u8, i32, u32, i64, u64);

macro_rules! float_elem {
    ($($t:ty => $eps:expr),*) => {$(
        impl TestElem for $t {
            const INT: bool = false;
            const EPS: f64 = $eps;
            fn random(rng: &mut StdRng, prod: bool) -> Self {
                let x: f64 = if prod { rng.gen_range(0.5..1.5) } else { rng.gen_range(-2.0..2.0) };
                <$t as CollType>::from_f64(x)
            }
        }
    )*};
}
float_elem!(f32 => 1e-6, f64 => 1e-14, f16 => 1.0 / 1024.0, bf16 => 1.0 / 128.0, Fp8E4M3 => 1.0 / 8.0, Fp8E5M2 => 1.0 / 4.0);

/// Rank `r`'s input of case `case`, `len` elements.
fn input<T: TestElem>(case: u64, r: usize, len: usize, prod: bool) -> Vec<T> {
    let mut rng = StdRng::seed_from_u64(case.wrapping_mul(0x9E37_79B9) ^ (r as u64) << 40);
    (0..len).map(|_| T::random(&mut rng, prod)).collect()
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum R {
    Sum,
    Prod,
    Max,
    Min,
    Avg,
    PreMul,
}
const REDS: [R; 6] = [R::Sum, R::Prod, R::Max, R::Min, R::Avg, R::PreMul];

fn scalar<T: TestElem>() -> T {
    if T::INT {
        T::wrap(3)
    } else {
        T::from_f64(0.75)
    }
}

fn op<T: TestElem>(r: R) -> Op<'static, T> {
    match r {
        R::Sum => Op::Sum,
        R::Prod => Op::Prod,
        R::Max => Op::Max,
        R::Min => Op::Min,
        R::Avg => Op::Avg,
        R::PreMul => Op::PreMulSum(scalar::<T>()),
    }
}

/// Whether `got` is the reduction `r` of `xs` (one value per rank).
fn check_one<T: TestElem>(r: R, xs: &[T], got: T) -> Result<(), String> {
    let n = xs.len() as i128;
    if T::INT {
        let v: Vec<i128> = xs.iter().map(|x| x.to_i128()).collect();
        let s = scalar::<T>().to_i128();
        let want = match r {
            R::Sum => T::wrap(v.iter().sum()),
            R::Prod => T::wrap(v.iter().fold(1u128, |a, &x| a.wrapping_mul(x as u128)) as i128),
            R::Max => T::wrap(*v.iter().max().unwrap()),
            R::Min => T::wrap(*v.iter().min().unwrap()),
            R::Avg => T::wrap(T::wrap(v.iter().sum()).to_i128() / n),
            R::PreMul => T::wrap(v.iter().map(|x| x.wrapping_mul(s)).sum()),
        };
        return if want == got { Ok(()) } else { Err(format!("want {want:?}")) };
    }
    let v: Vec<f64> = xs.iter().map(|x| x.to_f64()).collect();
    let s = scalar::<T>().to_f64();
    let want = match r {
        R::Sum => v.iter().sum(),
        R::Prod => v.iter().product(),
        R::Max => v.iter().cloned().fold(f64::MIN, f64::max),
        R::Min => v.iter().cloned().fold(f64::MAX, f64::min),
        R::Avg => v.iter().sum::<f64>() / n as f64,
        R::PreMul => v.iter().map(|x| x * s).sum(),
    };
    let scale = v.iter().map(|x| x.abs()).fold(want.abs(), f64::max).max(1.0);
    let tol = T::EPS * scale * 2.0 + 1e-30;
    if (got.to_f64() - want).abs() <= tol {
        Ok(())
    } else {
        Err(format!("want {want} (tolerance {tol})"))
    }
}

/// A poisoned output of `len` elements with guards of `GUARD` elements
/// (so its elements start at an address that is a multiple of 16 bytes for
/// no type: the collectives' unaligned paths).
fn output<T: TestElem>(c: &Ctx, len: usize) -> DeviceBuffer<T> {
    output_with(c, len, GUARD)
}

/// A poisoned output of `len` elements with guards of `guard` elements.
fn output_with<T: TestElem>(c: &Ctx, len: usize, guard: usize) -> DeviceBuffer<T> {
    let mut b = c.comm.device().alloc::<T>(len + 2 * guard).unwrap();
    c.stream.memset(&mut b, POISON).unwrap();
    b
}

/// Guard elements of an output whose elements start 16-byte aligned (the
/// collectives' vector paths).
fn aligned_guard<T>() -> usize {
    16 / std::mem::size_of::<T>()
}

/// The output's elements, after checking its guards kept their poison.
fn read_out<T: TestElem>(stream: &Stream, b: &DeviceBuffer<T>, what: &str) -> Vec<T> {
    read_out_with(stream, b, GUARD, what)
}

/// [`read_out`] of an output with guards of `guard` elements.
fn read_out_with<T: TestElem>(stream: &Stream, b: &DeviceBuffer<T>, guard: usize, what: &str) -> Vec<T> {
    let all = stream.read_vec(b).unwrap();
    let len = all.len() - 2 * guard;
    let bytes: &[u8] = bytemuck::cast_slice(&all);
    let size = std::mem::size_of::<T>();
    let guard_ok = bytes[..guard * size].iter().chain(&bytes[(guard + len) * size..]).all(|&x| x == POISON);
    assert!(guard_ok, "{what}: bytes around the output were written");
    all[guard..guard + len].to_vec()
}

struct Ctx<'c> {
    comm: &'c Communicator,
    coll: Collectives<'c>,
    stream: &'c Stream,
    n: usize,
    me: usize,
    case: u64,
}

impl Ctx<'_> {
    fn next_case(&mut self) -> u64 {
        self.case += 1;
        self.case
    }
}

/// all_reduce, reduce and reduce_scatter of `T` for every reduction, with
/// `len` elements per rank (reduce_scatter: per rank's shard).
fn reductions<T: TestElem>(c: &mut Ctx, len: usize, algorithm: Algorithm) {
    let (n, me) = (c.n, c.me);
    for r in REDS {
        let case = c.next_case();
        let prod = r == R::Prod;
        let ins: Vec<Vec<T>> = (0..n).map(|q| input::<T>(case, q, len * n, prod)).collect();
        let send = c.comm.device().alloc_from(&ins[me]).unwrap();
        let what = format!("{:?} {r:?} len {len} {algorithm:?}", T::DTYPE);
        // all_reduce of the first `len` elements, into an output at an
        // odd element offset and into one at a 16-byte aligned offset (the
        // pushed one-shot's vector path, `coll::all_reduce_pushed`).
        let s = Operand::range(&send, 0, len).unwrap();
        for guard in [GUARD, aligned_guard::<T>()] {
            let out = output_with::<T>(c, len, guard);
            c.coll.all_reduce_with(s, Operand::range(&out, guard, len).unwrap(), op(r), algorithm, c.stream).unwrap();
            c.coll.synchronize(c.stream).unwrap_or_else(|e| panic!("all_reduce {what} guard {guard}: {e}"));
            let got = read_out_with(c.stream, &out, guard, &what);
            for (i, g) in got.iter().enumerate() {
                let xs: Vec<T> = ins.iter().map(|v| v[i]).collect();
                check_one(r, &xs, *g)
                    .unwrap_or_else(|e| panic!("all_reduce {what} guard {guard} element {i}: got {g:?}, {e}"));
            }
        }
        // reduce: direct to the last rank, relayed and LL to roots that
        // move with the case (Auto: all three, LL where the slots hold it).
        let fits_ll = len * std::mem::size_of::<T>() <= c.coll.config().ll_bytes;
        let rooted: &[Algorithm] = match algorithm {
            Algorithm::Auto if fits_ll => &[Algorithm::OneShot, Algorithm::TwoShot, Algorithm::Ll],
            Algorithm::Auto => &[Algorithm::OneShot, Algorithm::TwoShot],
            Algorithm::TwoShot => &[Algorithm::TwoShot],
            _ => &[Algorithm::OneShot],
        };
        for &how in rooted {
            let root = match how {
                Algorithm::TwoShot => case as usize % n,
                Algorithm::Ll => (case as usize + 1) % n,
                _ => n - 1,
            };
            let out = output::<T>(c, len);
            let recv = if me == root { Operand::range(&out, GUARD, len).unwrap() } else { Operand::null() };
            c.coll.reduce_with(Operand::range(&send, 0, len).unwrap(), recv, op(r), root, how, c.stream).unwrap();
            c.coll.synchronize(c.stream).unwrap_or_else(|e| panic!("reduce {what} {how:?}: {e}"));
            let got = read_out(c.stream, &out, &what);
            if me == root {
                for (i, g) in got.iter().enumerate() {
                    let xs: Vec<T> = ins.iter().map(|v| v[i]).collect();
                    check_one(r, &xs, *g)
                        .unwrap_or_else(|e| panic!("reduce {what} {how:?} to {root} element {i}: got {g:?}, {e}"));
                }
            } else {
                let poison = bytemuck::cast_slice::<T, u8>(&got).iter().all(|&b| b == POISON);
                assert!(poison, "reduce {what} {how:?}: a non-root's output was written");
            }
        }
        // reduce_scatter: shard `me` of `n * len`.
        let out = output::<T>(c, len);
        c.coll.reduce_scatter(&send, Operand::range(&out, GUARD, len).unwrap(), op(r), c.stream).unwrap();
        c.coll.synchronize(c.stream).unwrap_or_else(|e| panic!("reduce_scatter {what}: {e}"));
        let got = read_out(c.stream, &out, &what);
        for (i, g) in got.iter().enumerate() {
            let xs: Vec<T> = ins.iter().map(|v| v[me * len + i]).collect();
            check_one(r, &xs, *g).unwrap_or_else(|e| panic!("reduce_scatter {what} element {i}: got {g:?}, {e}"));
        }
    }
}

/// all_reduce (sum) of `len` elements in place and out of place, from a
/// window (zero copy) and from a buffer, with `algorithm`.
fn all_reduce_places<T: TestElem>(c: &mut Ctx, len: usize, algorithm: Algorithm) {
    let (n, me) = (c.n, c.me);
    let size = std::mem::size_of::<T>();
    let case = c.next_case();
    let ins: Vec<Vec<T>> = (0..n).map(|q| input::<T>(case, q, len, false)).collect();
    let what = format!("{:?} len {len} {algorithm:?}", T::DTYPE);
    let check = |got: &[T], how: &str| {
        for (i, g) in got.iter().enumerate() {
            let xs: Vec<T> = ins.iter().map(|v| v[i]).collect();
            check_one(R::Sum, &xs, *g)
                .unwrap_or_else(|e| panic!("all_reduce {how} {what} element {i}: got {g:?}, {e}"));
        }
    };
    // In place in a buffer.
    let buf = c.comm.device().alloc_from(&ins[me]).unwrap();
    c.coll.all_reduce_with(&buf, &buf, Op::Sum, algorithm, c.stream).unwrap();
    c.coll.synchronize(c.stream).unwrap();
    check(&c.stream.read_vec(&buf).unwrap(), "in place (buffer)");
    // From a window at an odd element offset, out of place and in place.
    let off = 3 * size;
    let mem = c.comm.mem_alloc((off + len * size).max(1)).unwrap();
    let window = c.comm.register_window(&mem, WindowFlags::COLL_SYMMETRIC).unwrap();
    if len > 0 {
        window.write(c.stream, off, &ins[me]).unwrap();
    }
    let out = output::<T>(c, len);
    let src = Operand::window(&window, off, len).unwrap();
    c.coll.all_reduce_with(src, Operand::range(&out, GUARD, len).unwrap(), Op::Sum, algorithm, c.stream).unwrap();
    c.coll.synchronize(c.stream).unwrap();
    check(&read_out(c.stream, &out, &what), "window → buffer");
    c.coll.all_reduce_with(src, src, Op::Sum, algorithm, c.stream).unwrap();
    c.coll.synchronize(c.stream).unwrap();
    let mut got = vec![T::zeroed(); len];
    window.read(c.stream, off, &mut got).unwrap();
    check(&got, "in place (window)");
    c.stream.synchronize().unwrap();
    window.deregister().unwrap();
}

/// all_gather, broadcast, gather, scatter and all_to_all of `len` elements
/// per rank (per pair for all_to_all), from buffers and windows.
fn movements<T: TestElem>(c: &mut Ctx, len: usize) {
    let (n, me) = (c.n, c.me);
    let size = std::mem::size_of::<T>();
    let case = c.next_case();
    let ins: Vec<Vec<T>> = (0..n).map(|q| input::<T>(case, q, len * n, false)).collect();
    let what = format!("{:?} len {len}", T::DTYPE);
    let send = c.comm.device().alloc_from(&ins[me]).unwrap();
    let mem = c.comm.mem_alloc((len * n * size).max(1)).unwrap();
    let window = c.comm.register_window(&mem, WindowFlags::COLL_SYMMETRIC).unwrap();
    if len > 0 {
        window.write(c.stream, 0, &ins[me]).unwrap();
    }
    c.stream.synchronize().unwrap();
    for from_window in [false, true] {
        let src = |count: usize| {
            if from_window {
                Operand::window(&window, 0, count).unwrap()
            } else {
                Operand::range(&send, 0, count).unwrap()
            }
        };
        let how = if from_window { "window" } else { "buffer" };
        // all_gather
        let out = output::<T>(c, n * len);
        c.coll.all_gather(src(len), Operand::range(&out, GUARD, n * len).unwrap(), c.stream).unwrap();
        c.coll.synchronize(c.stream).unwrap();
        let got = read_out(c.stream, &out, &what);
        let want: Vec<T> = (0..n).flat_map(|q| ins[q][..len].to_vec()).collect();
        assert_eq!(got, want, "all_gather {what} ({how})");
        // broadcast from each root (direct, and LL where the slots hold
        // it), and relayed from one
        let relayed = (Algorithm::TwoShot, case as usize % n);
        let ll = if len * size <= c.coll.config().ll_bytes { n } else { 0 };
        let direct = (0..n).map(|r| (Algorithm::OneShot, r));
        for (algorithm, root) in direct.chain((0..ll).map(|r| (Algorithm::Ll, (r + 1) % n))).chain([relayed]) {
            let out = output::<T>(c, len);
            let s = if me == root { src(len) } else { Operand::null() };
            c.coll.broadcast_with(s, Operand::range(&out, GUARD, len).unwrap(), root, algorithm, c.stream).unwrap();
            c.coll.synchronize(c.stream).unwrap();
            assert_eq!(
                read_out(c.stream, &out, &what),
                ins[root][..len].to_vec(),
                "broadcast {what} root {root} ({how}, {algorithm:?})"
            );
        }
        // gather to the last rank, scatter from rank 0
        let out = output::<T>(c, n * len);
        let recv = if me == n - 1 { Operand::range(&out, GUARD, n * len).unwrap() } else { Operand::null() };
        c.coll.gather(src(len), recv, n - 1, c.stream).unwrap();
        c.coll.synchronize(c.stream).unwrap();
        let got = read_out(c.stream, &out, &what);
        if me == n - 1 {
            assert_eq!(got, want, "gather {what} ({how})");
        }
        let out = output::<T>(c, len);
        let s = if me == 0 { src(n * len) } else { Operand::null() };
        c.coll.scatter(s, Operand::range(&out, GUARD, len).unwrap(), 0, c.stream).unwrap();
        c.coll.synchronize(c.stream).unwrap();
        assert_eq!(
            read_out(c.stream, &out, &what),
            ins[0][me * len..(me + 1) * len].to_vec(),
            "scatter {what} ({how})"
        );
        // all_to_all
        let out = output::<T>(c, n * len);
        c.coll.all_to_all(src(n * len), Operand::range(&out, GUARD, n * len).unwrap(), c.stream).unwrap();
        c.coll.synchronize(c.stream).unwrap();
        let want: Vec<T> = (0..n).flat_map(|q| ins[q][me * len..(me + 1) * len].to_vec()).collect();
        assert_eq!(read_out(c.stream, &out, &what), want, "all_to_all {what} ({how})");
    }
    // In-place broadcast (the root's send is its recv) and all_gather
    // (send is the rank's own block of recv).
    for algorithm in [Algorithm::OneShot, Algorithm::TwoShot, Algorithm::Ll] {
        if algorithm == Algorithm::Ll && len * size > c.coll.config().ll_bytes {
            continue;
        }
        let buf = c.comm.device().alloc_from(&ins[me][..len]).unwrap();
        c.coll.broadcast_with(&buf, &buf, 0, algorithm, c.stream).unwrap();
        c.coll.synchronize(c.stream).unwrap();
        assert_eq!(c.stream.read_vec(&buf).unwrap(), ins[0][..len].to_vec(), "broadcast in place {what} {algorithm:?}");
    }
    let mut all = vec![T::zeroed(); n * len];
    all[me * len..(me + 1) * len].copy_from_slice(&ins[me][..len]);
    let buf = c.comm.device().alloc_from(&all).unwrap();
    c.coll.all_gather(Operand::range(&buf, me * len, len).unwrap(), &buf, c.stream).unwrap();
    c.coll.synchronize(c.stream).unwrap();
    let want: Vec<T> = (0..n).flat_map(|q| ins[q][..len].to_vec()).collect();
    assert_eq!(c.stream.read_vec(&buf).unwrap(), want, "all_gather in place {what}");
    window.deregister().unwrap();
}

/// LL broadcasts and reduces queued back to back with no wait between
/// them, roots moving, odd sizes up to the LL slots: a root can run calls
/// ahead of its receivers, so only the channels' credits keep a slot from
/// being overwritten before it was read. Every output checked at the end.
fn ll_rooted_queued(c: &mut Ctx) {
    let (n, me) = (c.n, c.me);
    let max = c.coll.config().ll_bytes / 4;
    let calls = 24;
    let mut checks = Vec::new();
    for i in 0..calls {
        let case = c.next_case();
        let len = [1, 7, 33, max.max(1)][i % 4].min(max.max(1));
        let ins: Vec<Vec<f32>> = (0..n).map(|q| input::<f32>(case, q, len, false)).collect();
        let send = c.comm.device().alloc_from(&ins[me]).unwrap();
        let out = output::<f32>(c, len);
        let root = (i * 5 + i / n) % n;
        let recv = Operand::range(&out, GUARD, len).unwrap();
        if i % 2 == 0 {
            let s = if me == root { Operand::from(&send) } else { Operand::null() };
            c.coll.broadcast_with(s, recv, root, Algorithm::Ll, c.stream).unwrap();
        } else {
            let recv = if me == root { recv } else { Operand::null() };
            c.coll.reduce_with(&send, recv, Op::Sum, root, Algorithm::Ll, c.stream).unwrap();
        }
        checks.push((i, root, ins, send, out));
    }
    c.coll.synchronize(c.stream).unwrap_or_else(|e| panic!("queued LL broadcasts and reduces: {e}"));
    for (i, root, ins, _send, out) in checks {
        let what = format!("queued LL call {i} (root {root})");
        let got = read_out(c.stream, &out, &what);
        if i % 2 == 0 {
            assert_eq!(got, ins[root], "{what}: broadcast");
        } else if me == root {
            for (k, g) in got.iter().enumerate() {
                let xs: Vec<f32> = ins.iter().map(|v| v[k]).collect();
                check_one(R::Sum, &xs, *g).unwrap_or_else(|e| panic!("{what}: reduce element {k}: got {g}, {e}"));
            }
        } else {
            assert!(
                bytemuck::cast_slice::<f32, u8>(&got).iter().all(|&b| b == POISON),
                "{what}: a non-root's output was written"
            );
        }
    }
}

/// Collectives captured into a CUDA graph once and launched four times,
/// with fresh inputs and poisoned outputs before each launch, and an
/// uncaptured LL all-reduce between launches (each replay must number its
/// LL calls afresh: a replayed number would read the last replay's data).
/// Sends refuse a capturing stream, and the capture survives the refusal.
fn graph_replay(c: &mut Ctx) {
    let (n, me) = (c.n, c.me);
    let dev = c.comm.device();
    let (ll, big) = (5, 301); // 20 bytes: LL; 1204 bytes: several chunks of the tiny scratch
    let root = n - 1;
    let mut a = dev.alloc::<f32>(ll).unwrap();
    let mut b = dev.alloc::<f32>(big).unwrap();
    let mut outs: Vec<DeviceBuffer<f32>> =
        [ll, big, ll, big, big, n * ll].iter().map(|&l| output::<f32>(c, l)).collect();
    let range = |i: usize, l: usize| Operand::range(&outs[i], GUARD, l).unwrap();
    let record = |s: &Stream| -> devcomm::Result<()> {
        c.coll.all_reduce_with(&a, range(0, ll), Op::Sum, Algorithm::Ll, s)?;
        c.coll.all_reduce_with(&b, range(1, big), Op::Sum, Algorithm::TwoShot, s)?;
        c.coll.broadcast_with(&a, range(2, ll), 0, Algorithm::Ll, s)?;
        c.coll.broadcast(&b, range(3, big), root, s)?;
        c.coll.reduce(&b, range(4, big), Op::Max, root, s)?;
        c.coll.all_gather(&a, range(5, n * ll), s)
    };
    // Once uncaptured: what a first call builds is built.
    record(c.stream).unwrap();
    c.coll.synchronize(c.stream).unwrap();
    let graph = c
        .stream
        .capture(|s| {
            record(s)?;
            if n > 1 {
                match c.coll.send(&a, (me + 1) % n, s) {
                    Err(Error::InvalidUsage(m)) => assert!(m.contains("graph"), "send under capture: {m}"),
                    other => panic!("send under capture: expected InvalidUsage, got {other:?}"),
                }
            }
            Ok(())
        })
        .unwrap_or_else(|e| panic!("capturing collectives: {e}"));
    let extra = dev.alloc::<f32>(ll).unwrap();
    for launch in 0..4 {
        let case = c.next_case();
        let ia: Vec<Vec<f32>> = (0..n).map(|q| input::<f32>(case, q, ll, false)).collect();
        let ib: Vec<Vec<f32>> = (0..n).map(|q| input::<f32>(case + 1000, q, big, false)).collect();
        c.stream.write(&mut a, &ia[me]).unwrap();
        c.stream.write(&mut b, &ib[me]).unwrap();
        for o in outs.iter_mut() {
            c.stream.memset(o, POISON).unwrap();
        }
        // SAFETY: every buffer the graph uses is alive until the
        // synchronize below.
        unsafe { graph.launch(c.stream).unwrap() };
        c.coll.all_reduce_with(&extra, &extra, Op::Sum, Algorithm::Ll, c.stream).unwrap();
        c.coll.synchronize(c.stream).unwrap_or_else(|e| panic!("graph launch {launch}: {e}"));
        let what = |k: &str| format!("graph launch {launch}: {k}");
        let sum = |ins: &[Vec<f32>], got: &[f32], k: &str| {
            for (i, g) in got.iter().enumerate() {
                let xs: Vec<f32> = ins.iter().map(|v| v[i]).collect();
                check_one(R::Sum, &xs, *g).unwrap_or_else(|e| panic!("{} element {i}: got {g}, {e}", what(k)));
            }
        };
        sum(&ia, &read_out(c.stream, &outs[0], &what("LL all-reduce")), "LL all-reduce");
        sum(&ib, &read_out(c.stream, &outs[1], &what("two-shot all-reduce")), "two-shot all-reduce");
        assert_eq!(read_out(c.stream, &outs[2], &what("LL broadcast")), ia[0], "{}", what("LL broadcast"));
        assert_eq!(read_out(c.stream, &outs[3], &what("broadcast")), ib[root], "{}", what("broadcast"));
        let got = read_out(c.stream, &outs[4], &what("reduce"));
        if me == root {
            for (i, g) in got.iter().enumerate() {
                let xs: Vec<f32> = ib.iter().map(|v| v[i]).collect();
                check_one(R::Max, &xs, *g).unwrap_or_else(|e| panic!("{} element {i}: got {g}, {e}", what("reduce")));
            }
        }
        assert_eq!(read_out(c.stream, &outs[5], &what("all-gather")), ia.concat(), "{}", what("all-gather"));
    }
}

/// A world of several LSA teams refuses to capture its collectives (their
/// channels are numbered on the host), and the capture survives it.
fn graph_refused_across_teams(c: &mut Ctx) {
    let a = c.comm.device().alloc_from(&[1.0f32; 7]).unwrap();
    let graph = c.stream.capture(|s| {
        match c.coll.all_reduce(&a, &a, Op::Sum, s) {
            Err(Error::InvalidUsage(m)) => assert!(m.contains("graph"), "all_reduce under capture: {m}"),
            other => panic!("all_reduce across teams under capture: expected InvalidUsage, got {other:?}"),
        }
        Ok(())
    });
    graph.unwrap_or_else(|e| panic!("an empty capture: {e}"));
}

/// Bad input returns typed errors (on this rank alone: nothing is launched).
fn bad_input(c: &mut Ctx) {
    let n = c.n;
    let a = c.comm.device().alloc::<f32>(10).unwrap();
    let b = c.comm.device().alloc::<f32>(11).unwrap();
    let inv = |r: devcomm::Result<()>, what: &str| match r {
        Err(Error::InvalidArgument(m)) => assert!(!m.is_empty(), "{what}"),
        other => panic!("{what}: expected InvalidArgument, got {other:?}"),
    };
    inv(c.coll.all_reduce(&a, &b, Op::Sum, c.stream), "all_reduce lengths differ");
    inv(c.coll.reduce(&a, &a, Op::Sum, n, c.stream), "reduce root out of range");
    inv(c.coll.broadcast(&a, &a, n + 3, c.stream), "broadcast root out of range");
    inv(c.coll.all_reduce(Operand::null(), &a, Op::Sum, c.stream), "null send");
    inv(Operand::range(&a, 5, 6).map(|_| ()), "range past the end");
    inv(Operand::range(&a, usize::MAX, 2).map(|_| ()), "range overflows");
    let big = c.comm.device().alloc::<f32>(10_000).unwrap();
    inv(c.coll.all_reduce_with(&big, &big, Op::Sum, Algorithm::Ll, c.stream), "LL too large");
    inv(c.coll.broadcast_with(&big, &big, 0, Algorithm::Ll, c.stream), "LL broadcast too large");
    inv(c.coll.reduce_with(&big, &big, Op::Sum, 0, Algorithm::Ll, c.stream), "LL reduce too large");
    if n > 1 {
        inv(c.coll.all_gather(&a, &a, c.stream), "all_gather recv not ranks × send");
    }
    let mem = c.comm.mem_alloc(64).unwrap();
    let plain = c.comm.register_window(&mem, WindowFlags::DEFAULT).unwrap();
    inv(Operand::<f32>::window(&plain, 0, 4).map(|_| ()), "window without COLL_SYMMETRIC");
    plain.deregister().unwrap();
    let mem = c.comm.mem_alloc(64).unwrap();
    let w = c.comm.register_window(&mem, WindowFlags::COLL_SYMMETRIC).unwrap();
    inv(Operand::<f32>::window(&w, 0, 17).map(|_| ()), "window range past the end");
    inv(Operand::<f32>::window(&w, 2, 4).map(|_| ()), "window offset misaligned");
    w.deregister().unwrap();
    if n > 1 {
        let odd = c.comm.device().alloc::<f32>(n * 3 + 1).unwrap();
        let out = c.comm.device().alloc::<f32>(n * 3 + 1).unwrap();
        inv(c.coll.all_to_all(&odd, &out, c.stream), "all_to_all count not a multiple of ranks");
    }
    inv(c.coll.all_to_all(&a, &a, c.stream), "all_to_all in place");
}

macro_rules! every_type {
    ($f:ident, $($arg:expr),*) => {
        $f::<i8>($($arg),*);
        $f::<u8>($($arg),*);
        $f::<i32>($($arg),*);
        $f::<u32>($($arg),*);
        $f::<i64>($($arg),*);
        $f::<u64>($($arg),*);
        $f::<f16>($($arg),*);
        $f::<f32>($($arg),*);
        $f::<f64>($($arg),*);
        $f::<bf16>($($arg),*);
        $f::<Fp8E4M3>($($arg),*);
        $f::<Fp8E5M2>($($arg),*);
    };
}

/// Set for a shorter battery (the 8-rank case on the emulated runtime).
const QUICK_ENV: &str = "DEVCOMM_COLL_TEST_QUICK";
/// Several LSA teams: `full` adds the multi-team battery to the shorter
/// one; `light` runs a lighter one instead (many ranks, or TCP).
const TEAMS_ENV: &str = "DEVCOMM_COLL_TEST_TEAMS";

/// A scratch small enough that small messages take every path: LL up to
/// 256 bytes, chunks of 1 KiB, a CTA per 512 bytes (up to 4); over several
/// LSA teams, hierarchical all-reduces of 64 bytes and more split into
/// reduce-scatter, rail all-reduce, all-gather.
fn tiny() -> CollConfig {
    CollConfig {
        max_ctas: 4,
        bytes_per_cta: 512,
        ll_bytes: 256,
        stage_bytes: 1024,
        hier_split_min_bytes: 64,
        rail_chunk_bytes: 256,
        p2p_gin_chunk_bytes: 1024,
        p2p_gin_slots: 4,
        ..CollConfig::default()
    }
}

/// reduce_scatter in place (`recv` is the rank's own block of `send`) of
/// `len` elements per rank, every reduction.
fn reduce_scatter_in_place<T: TestElem>(c: &mut Ctx, len: usize) {
    let (n, me) = (c.n, c.me);
    for r in REDS {
        let case = c.next_case();
        let ins: Vec<Vec<T>> = (0..n).map(|q| input::<T>(case, q, len * n, r == R::Prod)).collect();
        let buf = c.comm.device().alloc_from(&ins[me]).unwrap();
        let what = format!("reduce_scatter in place {:?} {r:?} len {len}", T::DTYPE);
        c.coll.reduce_scatter(&buf, Operand::range(&buf, me * len, len).unwrap(), op(r), c.stream).unwrap();
        c.coll.synchronize(c.stream).unwrap_or_else(|e| panic!("{what}: {e}"));
        let all = c.stream.read_vec(&buf).unwrap();
        for (i, g) in all[me * len..(me + 1) * len].iter().enumerate() {
            let xs: Vec<T> = ins.iter().map(|v| v[me * len + i]).collect();
            check_one(r, &xs, *g).unwrap_or_else(|e| panic!("{what} element {i}: got {g:?}, {e}"));
        }
    }
}

/// A local buffer at device address `ptr` as a collective's operand.
fn buffer(ptr: u64) -> CollBuffer {
    CollBuffer { ptr, window: WindowDesc::NONE, offset: 0, in_window: 0, reserved: 0 }
}

/// The arguments of one device-side world collective on `c`'s context:
/// `count` elements from `src` into local `dst`, operator code `op` with
/// `scalar`'s bits, errors into the `u32` at `errors`.
fn world_args(c: &Ctx, src: CollBuffer, dst: u64, count: usize, op: u32, scalar: u64, errors: u64) -> CollArgs {
    CollArgs {
        ctx: c.coll.context(),
        src,
        dst: buffer(dst),
        count: count as u64,
        scalar,
        scalar_ptr: 0,
        errors,
        op,
        root: 0,
        algorithm: 0,
        seq: c.coll.next_seq(),
    }
}

/// `data` in a fresh window of `c`'s communicator at an odd offset (3
/// elements), as a collective's operand that peers read in place; keep the
/// memory and the window until the stream has synchronised.
fn window_input<'c, T: TestElem>(c: &Ctx<'c>, data: &[T]) -> (SymmetricMemory, Window<'c>, CollBuffer) {
    let off = 3 * std::mem::size_of::<T>();
    let mem = c.comm.mem_alloc(off + data.len().max(1) * std::mem::size_of::<T>()).unwrap();
    let window = c.comm.register_window(&mem, WindowFlags::COLL_SYMMETRIC).unwrap();
    if !data.is_empty() {
        window.write(c.stream, off, data).unwrap();
    }
    let src = CollBuffer {
        ptr: window.desc().local_ptr::<u8>(off as u64) as u64,
        window: window.desc(),
        offset: off as u64,
        in_window: 1,
        reserved: 0,
    };
    (mem, window, src)
}

/// Launches test kernel `K` with `args` on `parts` co-resident CTAs.
///
/// # Safety
/// `args` describe live buffers of the sizes `K` needs and the context of
/// `c.coll`; every rank launches the same.
unsafe fn launch_test<K: devcomm_device::Kernel<Args = (CollArgs,)>>(c: &Ctx, args: CollArgs, parts: u32) {
    let kernels = devcomm_tests::test_kernels(c.comm.device());
    let cfg = LaunchConfig::new(parts, c.coll.threads()).co_resident();
    // SAFETY: the caller's contract.
    unsafe { c.stream.launch_in::<K>(&kernels, cfg, (args,)).unwrap() };
}

/// A reducing collective of `devcomm_device::coll::hier`, as the test
/// kernels call it.
#[derive(Clone, Copy, Debug, PartialEq)]
enum WorldOp {
    AllReduce,
    ReduceScatter,
    /// To this world rank.
    Reduce(usize),
}

/// Types with test kernels that call the device-callable hierarchical
/// reducing collectives (`devcomm_test_kernels::hier`).
trait WorldKernel: TestElem {
    /// Launches `op`'s kernel with `args` on `parts` CTAs.
    ///
    /// # Safety
    /// As for [`launch_test`].
    unsafe fn launch_world(c: &Ctx, op: WorldOp, args: CollArgs, parts: u32);
}

macro_rules! world_kernel {
    ($($t:ty => $all_reduce:ident, $reduce_scatter:ident, $reduce:ident);*) => {$(
        impl WorldKernel for $t {
            unsafe fn launch_world(c: &Ctx, op: WorldOp, args: CollArgs, parts: u32) {
                use devcomm_test_kernels::hier::{$all_reduce, $reduce_scatter, $reduce};
                // SAFETY: the caller's contract.
                unsafe {
                    match op {
                        WorldOp::AllReduce => launch_test::<$all_reduce>(c, args, parts),
                        WorldOp::ReduceScatter => launch_test::<$reduce_scatter>(c, args, parts),
                        WorldOp::Reduce(_) => launch_test::<$reduce>(c, args, parts),
                    }
                }
            }
        }
    )*};
}
world_kernel!(i8 => world_all_reduce_i8, world_reduce_scatter_i8, world_reduce_i8;
    u64 => world_all_reduce_u64, world_reduce_scatter_u64, world_reduce_u64;
    f16 => world_all_reduce_f16, world_reduce_scatter_f16, world_reduce_f16;
    bf16 => world_all_reduce_bf16, world_reduce_scatter_bf16, world_reduce_bf16;
    f32 => world_all_reduce_f32, world_reduce_scatter_f32, world_reduce_f32;
    f64 => world_all_reduce_f64, world_reduce_scatter_f64, world_reduce_f64);

/// The device-callable hierarchical all-reduce (`coll::hier::all_reduce`,
/// called from a kernel of the tests' own with `Collectives::context`) of
/// `len` elements, every reduction (`all_ops`, else sum only), from a
/// buffer out of place, then in place and from a window at an odd offset
/// into a buffer; on `parts` CTAs.
fn world_all_reduce<T: WorldKernel>(c: &mut Ctx, len: usize, all_ops: bool, parts: u32) {
    world_reducing::<T>(c, WorldOp::AllReduce, len, all_ops, parts, true)
}

/// Device-callable hierarchical `op` (from a test kernel) of `len`
/// elements per rank's output, every reduction (`all_ops`, else sum only),
/// on `parts` CTAs: buffer → poisoned buffer, then (`places`) in place
/// (reduce-scatter: the output is the rank's own block of the input) and
/// window at an odd offset → buffer. A reduce's result is checked on its
/// root, and the output of ranks off the root's rail must stay untouched.
fn world_reducing<T: WorldKernel>(c: &mut Ctx, op: WorldOp, len: usize, all_ops: bool, parts: u32, places: bool) {
    let (n, me) = (c.n, c.me);
    let lsa = c.comm.lsa_size().unwrap();
    let size = std::mem::size_of::<T>();
    let (in_len, base) = if op == WorldOp::ReduceScatter { (len * n, me * len) } else { (len, 0) };
    let root = match op {
        WorldOp::Reduce(root) => Some(root),
        _ => None,
    };
    let has_result = root.is_none_or(|r| r == me);
    let untouched = root.is_some_and(|r| r % lsa != me % lsa);
    for r in REDS.into_iter().filter(|&r| all_ops || r == R::Sum) {
        let case = c.next_case();
        let ins: Vec<Vec<T>> = (0..n).map(|q| input::<T>(case, q, in_len, r == R::Prod)).collect();
        let what = format!("device hierarchical {op:?} {:?} {r:?} len {len} on {parts} CTAs", T::DTYPE);
        let mut sc = [0u8; 8];
        sc[..size].copy_from_slice(bytemuck::bytes_of(&scalar::<T>()));
        let op_code = match r {
            R::Sum => RedOp::Sum,
            R::Prod => RedOp::Prod,
            R::Max => RedOp::Max,
            R::Min => RedOp::Min,
            R::Avg => RedOp::Avg,
            R::PreMul => RedOp::PreMulSum,
        } as u32;
        let errors = c.comm.device().alloc_from(&[0u32]).unwrap();
        let run = |c: &Ctx, src: CollBuffer, dst: u64| {
            let mut args = world_args(c, src, dst, len, op_code, u64::from_le_bytes(sc), errors.device_addr());
            args.root = root.unwrap_or(0) as u32;
            // SAFETY: `src` and `dst` hold what `op` reads and writes and stay alive until the
            // stream is synchronised below; the context is `c.coll`'s; every rank makes the same
            // launches.
            unsafe { T::launch_world(c, op, args, parts) };
            c.stream.synchronize().unwrap();
            assert_eq!(c.stream.read_vec(&errors).unwrap(), [0], "{what}: error code");
        };
        let check = |got: &[T], how: &str| {
            if !has_result {
                return;
            }
            for (i, g) in got.iter().enumerate() {
                let xs: Vec<T> = ins.iter().map(|v| v[base + i]).collect();
                check_one(r, &xs, *g).unwrap_or_else(|e| panic!("{what} {how} element {i}: got {g:?}, {e}"));
            }
        };
        let check_out = |c: &Ctx, out: &DeviceBuffer<T>, how: &str| {
            let got = read_out(c.stream, out, &what);
            if untouched {
                let kept = bytemuck::cast_slice::<T, u8>(&got).iter().all(|&b| b == POISON);
                assert!(kept, "{what} {how}: rank {me}, off the root's rail, had its output written");
            }
            check(&got, how);
        };
        // Out of place from a buffer.
        let send = c.comm.device().alloc_from(&ins[me]).unwrap();
        let out = output::<T>(c, len);
        run(c, buffer(send.device_addr()), out.device_addr() + (GUARD * size) as u64);
        check_out(c, &out, "buffer → buffer");
        if !places {
            continue;
        }
        // In place.
        run(c, buffer(send.device_addr()), send.device_addr() + (base * size) as u64);
        check(&c.stream.read_vec(&send).unwrap()[base..base + len], "in place");
        // From a window at an odd element offset (peers read it in place).
        let (_mem, window, src) = window_input(c, &ins[me]);
        let out = output::<T>(c, len);
        run(c, src, out.device_addr() + (GUARD * size) as u64);
        check_out(c, &out, "window → buffer");
        c.stream.synchronize().unwrap();
        window.deregister().unwrap();
    }
}

/// The device-callable hierarchical all-gather (`coll::hier::all_gather`,
/// from a test kernel) of `len` bytes per rank on `parts` CTAs: buffer →
/// buffer, in place (the input at the rank's own block), window → buffer.
fn world_all_gather(c: &mut Ctx, len: usize, parts: u32) {
    use devcomm_test_kernels::hier::world_all_gather_u8;
    let (n, me) = (c.n, c.me);
    let case = c.next_case();
    let ins: Vec<Vec<u8>> = (0..n).map(|q| input::<u8>(case, q, len, false)).collect();
    let want: Vec<u8> = ins.concat();
    let what = format!("device hierarchical all_gather of {len} bytes on {parts} CTAs");
    let errors = c.comm.device().alloc_from(&[0u32]).unwrap();
    let run = |c: &Ctx, src: CollBuffer, dst: u64| {
        let args = world_args(c, src, dst, len, 0, 0, errors.device_addr());
        // SAFETY: `src` holds `len` bytes and `dst` `n * len`, alive until the stream is
        // synchronised below; the context is `c.coll`'s; every rank makes the same launches.
        unsafe { launch_test::<world_all_gather_u8>(c, args, parts) };
        c.stream.synchronize().unwrap();
        assert_eq!(c.stream.read_vec(&errors).unwrap(), [0], "{what}: error code");
    };
    // Buffer → buffer.
    let send = c.comm.device().alloc_from(&ins[me]).unwrap();
    let out = output::<u8>(c, n * len);
    run(c, buffer(send.device_addr()), out.device_addr() + GUARD as u64);
    assert_eq!(read_out(c.stream, &out, &what), want, "{what}: buffer → buffer");
    // In place: the input is the rank's own block of the output.
    let mut init = vec![POISON; n * len];
    init[me * len..(me + 1) * len].copy_from_slice(&ins[me]);
    let all = c.comm.device().alloc_from(&init).unwrap();
    run(c, buffer(all.device_addr() + (me * len) as u64), all.device_addr());
    assert_eq!(c.stream.read_vec(&all).unwrap(), want, "{what}: in place");
    // From a window at an odd offset.
    let (_mem, window, src) = window_input(c, &ins[me]);
    let out = output::<u8>(c, n * len);
    run(c, src, out.device_addr() + GUARD as u64);
    assert_eq!(read_out(c.stream, &out, &what), want, "{what}: window → buffer");
    c.stream.synchronize().unwrap();
    window.deregister().unwrap();
}

/// The device-callable hierarchical broadcast (`coll::hier::broadcast`,
/// from a test kernel) of `len` bytes from world rank `root` on `parts`
/// CTAs: buffer → buffer, in place, window → buffer.
fn world_broadcast(c: &mut Ctx, len: usize, parts: u32, root: usize) {
    use devcomm_test_kernels::hier::world_broadcast_u8;
    let me = c.me;
    let case = c.next_case();
    let mine = input::<u8>(case, me, len, false);
    let want = input::<u8>(case, root, len, false);
    let what = format!("device hierarchical broadcast of {len} bytes from {root} on {parts} CTAs");
    let errors = c.comm.device().alloc_from(&[0u32]).unwrap();
    let run = |c: &Ctx, src: CollBuffer, dst: u64| {
        let mut args = world_args(c, src, dst, len, 0, 0, errors.device_addr());
        args.root = root as u32;
        // SAFETY: `src` and `dst` hold `len` bytes, alive until the stream is synchronised
        // below; the context is `c.coll`'s; every rank makes the same launches.
        unsafe { launch_test::<world_broadcast_u8>(c, args, parts) };
        c.stream.synchronize().unwrap();
        assert_eq!(c.stream.read_vec(&errors).unwrap(), [0], "{what}: error code");
    };
    // Buffer → buffer.
    let send = c.comm.device().alloc_from(&mine).unwrap();
    let out = output::<u8>(c, len);
    run(c, buffer(send.device_addr()), out.device_addr() + GUARD as u64);
    assert_eq!(read_out(c.stream, &out, &what), want, "{what}: buffer → buffer");
    // In place (every rank's output is its input buffer).
    run(c, buffer(send.device_addr()), send.device_addr());
    assert_eq!(c.stream.read_vec(&send).unwrap(), want, "{what}: in place");
    // From a window at an odd offset.
    let (_mem, window, src) = window_input(c, &mine);
    let out = output::<u8>(c, len);
    run(c, src, out.device_addr() + GUARD as u64);
    assert_eq!(read_out(c.stream, &out, &what), want, "{what}: window → buffer");
    c.stream.synchronize().unwrap();
    window.deregister().unwrap();
}

/// Over several LSA teams: sizes that are multiples of nothing, across
/// the hierarchical all-reduce's two algorithms and its remainder, in
/// place and from windows; in-place reduce-scatter; more than one chunk.
fn multi_team_battery(c: &mut Ctx) {
    for len in [1, 7, 1000] {
        all_reduce_places::<f32>(c, len, Algorithm::Auto);
        all_reduce_places::<bf16>(c, len, Algorithm::Auto);
        all_reduce_places::<u64>(c, len, Algorithm::Auto);
        all_reduce_places::<i8>(c, len, Algorithm::Auto);
    }
    // A million and three elements on GPUs; on the emulated runtime (CPU
    // threads, the tiny scratch: thousands of chunks) a prime fifty times smaller.
    let big = if common::runtime() == "cuda" { 1_000_003 } else { 20_011 };
    all_reduce_places::<f32>(c, big, Algorithm::Auto);
    reductions::<f16>(c, 1001, Algorithm::Auto);
    reduce_scatter_in_place::<f32>(c, 13);
    reduce_scatter_in_place::<u8>(c, 13);
    movements::<f64>(c, 301);
    world_battery(c, big);
}

/// The device-callable hierarchical collectives given a context without
/// the rail exchange (over several teams): every rank's kernel reports
/// `CollError::BadArgument`, and nothing waits.
fn world_without_rail(c: &mut Ctx) {
    use devcomm_device::coll::CollError;
    use devcomm_test_kernels::hier::{world_all_reduce_f32, world_broadcast_u8, world_reduce_scatter_f32};
    let n = c.n;
    let send = c.comm.device().alloc_from(&vec![1.0f32; 4 * n]).unwrap();
    let out = c.comm.device().alloc::<f32>(4 * n).unwrap();
    for which in 0..3 {
        let errors = c.comm.device().alloc_from(&[0u32]).unwrap();
        let mut args = world_args(c, buffer(send.device_addr()), out.device_addr(), 4, 0, 0, errors.device_addr());
        // SAFETY: a context without the rail exchange (chunk 0) describes less than the
        // library's; the collectives must refuse it before touching anything.
        args.ctx = unsafe { args.ctx.with_rail(0, 0, 0) };
        assert!(!args.ctx.has_rail());
        // SAFETY: the buffers hold `4 * n` elements and outlive the synchronisation below;
        // every rank launches the same.
        unsafe {
            match which {
                0 => launch_test::<world_all_reduce_f32>(c, args, 2),
                1 => launch_test::<world_reduce_scatter_f32>(c, args, 2),
                _ => launch_test::<world_broadcast_u8>(c, args, 2),
            }
        }
        c.stream.synchronize().unwrap();
        let code = c.stream.read_vec(&errors).unwrap()[0];
        assert_eq!(code, CollError::BadArgument.code(), "hierarchical collective {which} without the rail exchange");
    }
}

/// The device-callable hierarchical collectives: every reduction for a
/// type of each width and f64, sizes around the team size and the rail
/// chunk, more chunks than slots (`big`), one CTA and several; reduces and
/// broadcasts from roots in the first and the last team, at LSA rank 0
/// and not.
fn world_battery(c: &mut Ctx, big: usize) {
    let (n, lsa) = (c.n, c.comm.lsa_size().unwrap());
    for parts in [1, 3] {
        world_all_reduce::<i8>(c, 37, true, parts);
        world_all_reduce::<f16>(c, 37, true, parts);
        world_all_reduce::<f32>(c, 37, true, parts);
        world_all_reduce::<u64>(c, 37, true, parts);
    }
    world_all_reduce::<bf16>(c, 1001, true, 4);
    world_all_reduce::<f64>(c, 301, true, 2);
    world_reducing::<i8>(c, WorldOp::ReduceScatter, 37, true, 3, true);
    world_reducing::<f16>(c, WorldOp::ReduceScatter, 37, true, 1, true);
    world_reducing::<f64>(c, WorldOp::ReduceScatter, 301, true, 2, true);
    world_reducing::<f32>(c, WorldOp::Reduce(n - 1), 37, true, 3, true);
    world_reducing::<u64>(c, WorldOp::Reduce(lsa), 37, true, 1, true);
    world_reducing::<bf16>(c, WorldOp::Reduce(1), 1001, true, 4, true);
    for len in [0, 1, 2, 5, 1000] {
        world_all_reduce::<f32>(c, len, false, 4);
    }
    for len in [0, 5, 1000] {
        world_reducing::<f32>(c, WorldOp::ReduceScatter, len, false, 4, true);
        world_reducing::<f32>(c, WorldOp::Reduce(len % n), len, false, 4, true);
    }
    // Out of place only: with several ranks per GPU (the GPU runs), each
    // wait for a rank of the same GPU costs a time slice, and the rail
    // exchange of tiny()'s 256-byte chunks waits thousands of times.
    world_reducing::<f32>(c, WorldOp::AllReduce, big, false, 4, false);
    world_reducing::<f32>(c, WorldOp::ReduceScatter, big / n / 4, false, 4, false);
    for (len, parts) in [(0, 2), (1, 1), (37, 3), (1001, 4)] {
        world_all_gather(c, len, parts);
    }
    for (len, parts, root) in [(0, 2, 0), (1, 1, 0), (37, 3, n - 1), (1001, 4, lsa + 1)] {
        world_broadcast(c, len, parts, root % n);
    }
    world_without_rail(c);
}

fn child_body(comm: &Communicator) {
    let stream = comm.device().new_stream().unwrap();
    let coll = comm.collectives_with(&tiny()).unwrap();
    let mut c = Ctx { comm, coll, stream: &stream, n: comm.count(), me: comm.rank(), case: 0 };
    // Every type and reduction, at an odd size (LL for the narrow types).
    if std::env::var(TEAMS_ENV).is_ok_and(|v| v == "light") {
        // Several LSA teams on many ranks: a type of each width, every
        // reduction, both hierarchical all-reduces, every collective.
        reductions::<i8>(&mut c, 37, Algorithm::Auto);
        reductions::<f16>(&mut c, 37, Algorithm::Auto);
        reductions::<f32>(&mut c, 37, Algorithm::Auto);
        reductions::<u64>(&mut c, 37, Algorithm::Auto);
        for len in [0, 33] {
            movements::<f32>(&mut c, len);
        }
        movements::<u8>(&mut c, 301);
        for len in [7, 1000] {
            all_reduce_places::<f32>(&mut c, len, Algorithm::Auto);
            all_reduce_places::<i8>(&mut c, len, Algorithm::Auto);
        }
        reduce_scatter_in_place::<f32>(&mut c, 13);
        world_all_reduce::<f32>(&mut c, 37, true, 3);
        world_all_reduce::<i8>(&mut c, 1000, true, 2);
        world_all_gather(&mut c, 333, 3);
        let last = c.n - 1;
        world_reducing::<f32>(&mut c, WorldOp::ReduceScatter, 37, true, 3, true);
        world_reducing::<bf16>(&mut c, WorldOp::Reduce(last), 333, false, 2, true);
        world_broadcast(&mut c, 333, 3, last);
        graph_refused_across_teams(&mut c);
        stream.synchronize().unwrap();
        assert!(c.coll.error().is_none());
        drop(c);
        comm.finalize().unwrap();
        return;
    }
    every_type!(reductions, &mut c, 37, Algorithm::Auto);
    // One team: the device-callable hierarchical all-reduce is the team's.
    if c.comm.lsa_size().unwrap() == c.n {
        world_all_reduce::<f32>(&mut c, 37, true, 2);
        world_all_gather(&mut c, 37, 2);
        let last = c.n - 1;
        world_reducing::<f32>(&mut c, WorldOp::ReduceScatter, 37, true, 2, true);
        world_reducing::<f32>(&mut c, WorldOp::Reduce(last), 37, false, 2, true);
        world_broadcast(&mut c, 37, 2, last);
    }
    if std::env::var(QUICK_ENV).is_ok() {
        // 8 emulated ranks on a small machine (strict mode in CI): every
        // collective, type and reduction once, the long matrix below on
        // fewer ranks.
        for len in [0, 33] {
            every_type!(movements, &mut c, len);
        }
        if std::env::var(TEAMS_ENV).is_ok_and(|v| v == "full") {
            multi_team_battery(&mut c);
        }
        ll_rooted_queued(&mut c);
        if c.comm.lsa_size().unwrap() == c.n {
            graph_replay(&mut c);
        } else {
            graph_refused_across_teams(&mut c);
        }
        bad_input(&mut c);
        stream.synchronize().unwrap();
        assert!(c.coll.error().is_none());
        // `all_reduce_sequence` runs on 1-4 ranks (and on 8 on the GPUs):
        // on 8 emulated ranks it took `coll_8_ranks` past its limit on
        // CI's two cores.
        drop(c);
        comm.finalize().unwrap();
        return;
    }
    // More than one chunk and several CTAs, one-shot and two-shot: every
    // reduction for a type of each width.
    for algorithm in [Algorithm::OneShot, Algorithm::TwoShot] {
        reductions::<i8>(&mut c, 700, algorithm);
        reductions::<bf16>(&mut c, 700, algorithm);
        reductions::<f32>(&mut c, 300, algorithm);
        reductions::<u64>(&mut c, 300, algorithm);
    }
    // Sizes and places for every algorithm.
    for len in [0, 1, 7, 33, 1000] {
        for algorithm in [Algorithm::Ll, Algorithm::OneShot, Algorithm::TwoShot] {
            if algorithm == Algorithm::Ll && len * 8 > 256 {
                continue; // bad_input covers LL past its slots
            }
            all_reduce_places::<f32>(&mut c, len, algorithm);
            all_reduce_places::<bf16>(&mut c, len, algorithm);
            all_reduce_places::<u64>(&mut c, len, algorithm);
            all_reduce_places::<i8>(&mut c, len, algorithm);
        }
    }
    // Data movement: every type at odd sizes, and past several chunks.
    for len in [0, 1, 33] {
        every_type!(movements, &mut c, len);
    }
    movements::<u8>(&mut c, 1500);
    movements::<f64>(&mut c, 300);
    ll_rooted_queued(&mut c);
    if c.comm.lsa_size().unwrap() == c.n {
        graph_replay(&mut c);
    } else {
        graph_refused_across_teams(&mut c);
    }
    bad_input(&mut c);
    stream.synchronize().unwrap();
    assert!(c.coll.error().is_none());
    let one_team = c.comm.lsa_size().unwrap() == c.n;
    drop(c);
    if one_team {
        stage_stamps(comm, &stream);
        all_reduce_sequence(comm, &stream);
        pushed_steps(comm, &stream);
        pushed_failing(comm, &stream);
    }
    comm.finalize().unwrap();
}

/// Device-callable one-shot all-reduces of local inputs called back to
/// back from one kernel, each call on its own data, by coops that change
/// size from call to call (the whole CTA, then its first warp alone): the
/// staging areas' parity rule across calls and coops (no closing barrier).
/// Every call's result exact (f32 sums of small integers), all checked
/// after the last call (a call that wrote into an earlier call's output
/// shows). Block sizes of two warps and of a partial third (80 threads);
/// several chunks per part, one, and parts with nothing to do.
fn all_reduce_sequence(comm: &Communicator, stream: &Stream) {
    use devcomm_test_kernels::coll_sequence::all_reduce_sequence_f32;
    let coll = comm.collectives_with(&tiny()).unwrap();
    let (n, me) = (comm.count(), comm.rank());
    let kernels = devcomm_tests::test_kernels(comm.device());
    for (count, parts, threads, iters) in [(1001usize, 4u32, 64u32, 9usize), (37, 3, 80, 8), (5, 4, 64, 7)] {
        let value = |r: usize, k: usize| ((k * 13 + r * 7 + count) % 97) as f32 - 40.0;
        let input: Vec<f32> = (0..iters * count).map(|k| value(me, k)).collect();
        let src = comm.device().alloc_from(&input).unwrap();
        let dst = comm.device().alloc_from(&vec![f32::NAN; iters * count]).unwrap();
        let errors = comm.device().alloc_from(&[0u32; 2]).unwrap();
        let cfg = LaunchConfig::new(parts, threads).co_resident();
        let args =
            (coll.context(), src.device_addr(), dst.device_addr(), count as u64, iters as u32, errors.device_addr());
        // SAFETY: the context is `coll`'s (4 parts), the grid and block the
        // same on every rank, `src` and `dst` hold `iters * count` floats.
        unsafe { stream.launch_in::<all_reduce_sequence_f32>(&kernels, cfg, args).unwrap() };
        stream.synchronize().unwrap();
        assert_eq!(stream.read_vec(&errors).unwrap(), [0, 0], "count {count}: the kernel reported an error");
        let got = stream.read_vec(&dst).unwrap();
        for (k, g) in got.iter().enumerate() {
            let want: f32 = (0..n).map(|r| value(r, k)).sum();
            assert_eq!(*g, want, "count {count} threads {threads}: call {} element {}", k / count, k % count);
        }
    }
    assert!(coll.error().is_none());
}

/// A device-callable pushed one-shot all-reduce whose reduction fails on
/// every rank after its pushes (`coll::all_reduce_pushed_by`), then the same
/// call that works, in one kernel: every CTA gets `BadArgument`, nothing
/// waits, and the second call meets and sums exactly. 4 parts of 32 floats:
/// the path by packs on 2 ranks, the general one on more.
fn pushed_failing(comm: &Communicator, stream: &Stream) {
    use devcomm_test_kernels::coll_sequence::all_reduce_pushed_failing_f32;
    let coll = comm.collectives_with(&tiny()).unwrap();
    let (n, me) = (comm.count(), comm.rank());
    let kernels = devcomm_tests::test_kernels(comm.device());
    let (parts, count) = (4u32, 4 * 32usize);
    let value = |r: usize, k: usize| ((k * 7 + r * 11) % 53) as f32 - 20.0;
    let input: Vec<f32> = (0..count).map(|k| value(me, k)).collect();
    let src = comm.device().alloc_from(&input).unwrap();
    let dst = comm.device().alloc_from(&vec![f32::NAN; count]).unwrap();
    let codes = comm.device().alloc_from(&[0u32; 2]).unwrap();
    let cfg = LaunchConfig::new(parts, 64).co_resident();
    let args = (coll.context(), src.device_addr(), dst.device_addr(), count as u64, codes.device_addr());
    // SAFETY: the context is `coll`'s (4 parts), the grid and block the same
    // on every rank, `src` and `dst` hold `count` floats, `codes` two zeroed
    // `u32`s.
    unsafe { stream.launch_in::<all_reduce_pushed_failing_f32>(&kernels, cfg, args).unwrap() };
    stream.synchronize().unwrap();
    assert_eq!(
        stream.read_vec(&codes).unwrap(),
        [parts, 0],
        "[CTAs whose failing call returned BadArgument, the next call's error code]"
    );
    let got = stream.read_vec(&dst).unwrap();
    for (k, g) in got.iter().enumerate() {
        let want: f32 = (0..n).map(|r| value(r, k)).sum();
        assert_eq!(*g, want, "element {k} after the failed call");
    }
    assert!(coll.error().is_none());
}

/// The pushed one-shot all-reduce of local inputs with parts larger than
/// one step of their CTA (64 threads × 4 packs of 16 bytes) but within one
/// staging chunk: the path by packs (`coll::all_reduce_pushed`) with more
/// than two steps per thread and a partial last one, out of place into a
/// 16-byte aligned output and in place; the first part whole packs, the
/// last with the tail (the general path). Every reduction; every type on
/// the GPUs, i8 and f32 emulated. The `tiny` scratch of the
/// other cases leaves that path parts of a few packs.
fn pushed_steps(comm: &Communicator, stream: &Stream) {
    // Two parts of 64 threads (a step: 4 KiB) and 128 KiB of staging each:
    // one chunk holds 16 KiB per rank on 8 ranks.
    let config = CollConfig { max_ctas: 2, threads: 64, stage_bytes: 256 << 10, ..CollConfig::default() };
    let coll = comm.collectives_with(&config).unwrap();
    let mut c = Ctx { comm, coll, stream, n: comm.count(), me: comm.rank(), case: 1000 };
    if common::runtime() == "cuda" {
        every_type!(pushed_steps_of, &mut c);
    } else {
        // On CPUs (CI's debug build on two cores) 16 and 4 lanes a pack:
        // the path's lanes depend on the width; every type's conversions
        // run in `reductions` (the same reducer, the general path).
        pushed_steps_of::<i8>(&mut c);
        pushed_steps_of::<f32>(&mut c);
    }
    stream.synchronize().unwrap();
    assert!(c.coll.error().is_none());
}

/// [`pushed_steps`] for `T`: two parts of ~2.1 steps of packs each, and 3
/// elements past the last whole pack.
fn pushed_steps_of<T: TestElem>(c: &mut Ctx) {
    let (n, me) = (c.n, c.me);
    let len = 2 * (2 * 256 * 16 + 500) / std::mem::size_of::<T>() + 3;
    for r in REDS {
        let case = c.next_case();
        let ins: Vec<Vec<T>> = (0..n).map(|q| input::<T>(case, q, len, r == R::Prod)).collect();
        let what = format!("pushed steps {:?} {r:?} len {len}", T::DTYPE);
        let check = |got: &[T], how: &str| {
            for (i, g) in got.iter().enumerate() {
                let xs: Vec<T> = ins.iter().map(|v| v[i]).collect();
                check_one(r, &xs, *g).unwrap_or_else(|e| panic!("{what} {how} element {i}: got {g:?}, {e}"));
            }
        };
        let send = c.comm.device().alloc_from(&ins[me]).unwrap();
        let guard = aligned_guard::<T>();
        let out = output_with::<T>(c, len, guard);
        let to = Operand::range(&out, guard, len).unwrap();
        c.coll.all_reduce_with(&send, to, op(r), Algorithm::OneShot, c.stream).unwrap();
        c.coll.synchronize(c.stream).unwrap_or_else(|e| panic!("{what}: {e}"));
        check(&read_out_with(c.stream, &out, guard, &what), "out of place");
        c.coll.all_reduce_with(&send, &send, op(r), Algorithm::OneShot, c.stream).unwrap();
        c.coll.synchronize(c.stream).unwrap_or_else(|e| panic!("{what} in place: {e}"));
        check(&c.stream.read_vec(&send).unwrap(), "in place");
    }
}

/// `CollConfig::stage_stamps`: an LL, a one-shot and a two-shot all-reduce
/// (f32 sums, exact) each leave every part's stages in order, the inner
/// ones only where the algorithm has them; a collectives object without
/// stamps refuses `stage_times`.
fn stage_stamps(comm: &Communicator, stream: &Stream) {
    let plain = comm.collectives_with(&tiny()).unwrap();
    assert!(matches!(plain.stage_times(stream), Err(Error::InvalidUsage(_))));
    drop(plain);
    let config = CollConfig { stage_stamps: true, ..tiny() };
    let coll = comm.collectives_with(&config).unwrap();
    let (n, me) = (comm.count(), comm.rank());
    for (len, algorithm, parts) in [(5, Algorithm::Ll, 1), (1001, Algorithm::OneShot, 4), (1001, Algorithm::TwoShot, 4)]
    {
        let value = |r: usize, i: usize| ((i * 7 + r * 3) % 64) as f32;
        let input: Vec<f32> = (0..len).map(|i| value(me, i)).collect();
        let send = comm.device().alloc_from(&input).unwrap();
        let recv = comm.device().alloc_from(&vec![f32::NAN; len]).unwrap();
        coll.all_reduce_with(&send, &recv, Op::Sum, algorithm, stream).unwrap();
        let got = stream.read_vec(&recv).unwrap();
        for (i, g) in got.iter().enumerate() {
            assert_eq!(*g, (0..n).map(|r| value(r, i)).sum::<f32>(), "{algorithm:?}: element {i}");
        }
        let stages = coll.stage_times(stream).unwrap();
        assert_eq!(stages.len(), parts, "{algorithm:?}: {stages:?}");
        assert_eq!(stages.iter().map(|p| p.start_ns).min(), Some(0));
        for p in &stages {
            let inner = [p.ready_ns, p.sent_ns, p.synced_ns];
            if algorithm == Algorithm::Ll {
                assert_eq!(inner, [None; 3], "{p:?}");
            } else {
                let mut at = p.start_ns;
                for s in inner {
                    let s = s.unwrap_or_else(|| panic!("{algorithm:?}: a stage missing: {p:?}"));
                    assert!(s >= at, "{algorithm:?}: stages out of order: {p:?}");
                    at = s;
                }
                assert!(p.done_ns >= at, "{p:?}");
            }
        }
    }
    assert!(coll.error().is_none());
}

#[test]
#[ignore = "a rank of a multi-rank test: its parent runs it"]
fn child_coll() {
    if !is_child("child_coll") {
        return;
    }
    let comm = Communicator::init_from_env().unwrap();
    child_body(&comm);
}

/// Device waits get 60 s: 8 emulated ranks on a 2-core machine are slow.
fn slow() -> [(&'static str, String); 1] {
    [("DEVCOMM_OP_TIMEOUT_MS", "60000".to_string())]
}

#[test]
fn coll_1_rank() {
    common::run_on_runtime("child_coll", 1, &slow());
}

/// The full battery's limit: CI's debug build of four strict emulated
/// ranks on two cores, beside another 4-rank test, took 96.5 s of the
/// default 120 (session 26).
const FULL_LIMIT: std::time::Duration = std::time::Duration::from_secs(300);

#[test]
fn coll_2_ranks() {
    common::run_on_runtime_within("child_coll", 2, &slow(), FULL_LIMIT);
}

#[test]
fn coll_3_ranks() {
    common::run_on_runtime_within("child_coll", 3, &slow(), FULL_LIMIT);
}

#[test]
fn coll_4_ranks() {
    common::run_on_runtime_within("child_coll", 4, &slow(), FULL_LIMIT);
}

#[test]
fn coll_8_ranks() {
    // On CPUs, 8 ranks run the shorter battery (the full one on 1-4 ranks);
    // on GPUs the full one.
    let mut env = slow().to_vec();
    if common::runtime() != "cuda" {
        env.push((QUICK_ENV, "1".to_string()));
    }
    common::run_on_runtime("child_coll", 8, &env);
}

/// Checking mode: ranks that disagree on a count get `InvalidArgument`
/// naming the field, on every rank, and nothing runs.
#[test]
#[ignore = "a rank of a multi-rank test: its parent runs it"]
fn child_coll_mismatch() {
    if !is_child("child_coll_mismatch") {
        return;
    }
    let comm = Communicator::init_from_env().unwrap();
    let coll = comm.collectives_with(&CollConfig { check_arguments: true, ..tiny() }).unwrap();
    let stream = comm.device().stream();
    let len = 8 + comm.rank();
    let x = comm.device().alloc_from(&vec![1.0f32; len]).unwrap();
    match coll.all_reduce(&x, &x, Op::Sum, stream) {
        Err(Error::InvalidArgument(m)) => assert!(m.contains("count"), "{m}"),
        other => panic!("mismatched counts: expected InvalidArgument, got {other:?}"),
    }
    // Matching calls still run afterwards.
    let y = comm.device().alloc_from(&[2.0f32; 4]).unwrap();
    coll.all_reduce(&y, &y, Op::Sum, stream).unwrap();
    coll.synchronize(stream).unwrap();
    assert_eq!(stream.read_vec(&y).unwrap(), vec![2.0 * comm.count() as f32; 4]);
    drop(coll);
    comm.finalize().unwrap();
}

#[test]
fn coll_mismatched_counts_are_refused_in_checking_mode() {
    common::run_on_runtime("child_coll_mismatch", 3, &[]);
}

/// The shorter battery on `n` ranks in LSA teams of `lsa`, collectives
/// over several teams forced `multi_team` (`flat`, `hier`, `auto`), GIN
/// over `transport` (`ce`: the copy engine, the default), with `battery`
/// (`quick`: the shorter one; `full`: it and the multi-team one; `light`).
fn multi_team(n: usize, lsa: usize, multi_team: &str, transport: &str, battery: &str) {
    let mut env = slow().to_vec();
    env.push(("DEVCOMM_LSA_SIZE", lsa.to_string()));
    env.push((devcomm::coll::MULTI_TEAM_ENV, multi_team.to_string()));
    env.push(("DEVCOMM_GIN_TRANSPORT", transport.to_string()));
    env.push((QUICK_ENV, "1".to_string()));
    env.push((TEAMS_ENV, battery.to_string()));
    // Six strict emulated ranks on CI's two cores, beside another test,
    // took 296 s of a 300 s limit once (and passed at 162 s alone).
    common::run_on_runtime_within("child_coll", n, &env, std::time::Duration::from_secs(600));
}

/// Several LSA teams (2 of 2): every collective flat (groups of sends and
/// receives, GIN between the teams).
#[test]
fn coll_4_ranks_in_two_lsa_teams() {
    multi_team(4, 2, "flat", "ce", "quick");
}

/// 2 teams of 2, hierarchical (LSA in the teams, GIN along the rails).
#[test]
fn coll_4_ranks_in_two_lsa_teams_hierarchical() {
    multi_team(4, 2, "hier", "ce", "full");
}

/// 2 teams of 2, hierarchical, GIN over TCP.
#[test]
fn coll_4_ranks_in_two_lsa_teams_hierarchical_over_tcp() {
    multi_team(4, 2, "hier", "tcp", "light");
}

/// 2 teams of 3, hierarchical.
#[test]
fn coll_6_ranks_in_two_lsa_teams_of_3_hierarchical() {
    multi_team(6, 3, "hier", "ce", "full");
}

/// 4 teams of 2, hierarchical.
#[test]
fn coll_8_ranks_in_four_lsa_teams_hierarchical() {
    multi_team(8, 2, "hier", "ce", "light");
}

/// Every rank its own LSA team, GIN over TCP: flat (what `auto` picks
/// with one-rank teams).
#[test]
fn coll_3_ranks_over_gin_tcp() {
    multi_team(3, 1, "auto", "tcp", "quick");
}

/// One-rank teams with the hierarchical path forced (its team steps copy).
#[test]
fn coll_3_ranks_over_gin_tcp_hierarchical() {
    multi_team(3, 1, "hier", "tcp", "light");
}

/// The GIN bytes of each collective, flat and hierarchical, on teams of 2
/// (in checking mode): results checked, bytes equal to what the
/// algorithms send (`(T-1)·L` blocks flat, about `T-1` hierarchical), at
/// least `L` times fewer hierarchical.
#[test]
#[ignore = "a rank of a multi-rank test: its parent runs it"]
fn child_coll_gin_bytes() {
    if !is_child("child_coll_gin_bytes") {
        return;
    }
    let comm = Communicator::init_from_env().unwrap();
    let (n, me, l) = (comm.count(), comm.rank(), comm.lsa_size().unwrap());
    let t = n / l;
    let stream = comm.device().stream();
    let len = 1000usize;
    let s = 4u64;
    let ins: Vec<Vec<f32>> = (0..n).map(|q| input::<f32>(77, q, n * len, false)).collect();
    let sum = |i: usize| -> Vec<f32> { ins.iter().map(|v| v[i]).collect() };
    let check = |got: &[f32], want: &dyn Fn(usize) -> Vec<f32>, what: &str| {
        for (i, g) in got.iter().enumerate() {
            check_one(R::Sum, &want(i), *g).unwrap_or_else(|e| panic!("{what} element {i}: got {g}, {e}"));
        }
    };
    let mut bytes = Vec::new();
    for mode in [MultiTeam::Flat, MultiTeam::Hierarchical] {
        // Checking mode on: the hierarchical broadcast's and reduce's rail
        // steps run on some ranks only and must not wait for the others.
        let config =
            CollConfig { multi_team: mode, hier_split_min_bytes: 64, check_arguments: true, ..CollConfig::default() };
        let coll = comm.collectives_with(&config).unwrap();
        let send = comm.device().alloc_from(&ins[me]).unwrap();
        let mut per_op = Vec::new();
        let mut mark = coll.gin_bytes_sent();
        let mut step = |what: &str, got: Vec<f32>, want: &dyn Fn(usize) -> Vec<f32>| {
            check(&got, want, &format!("{what} ({mode:?})"));
            let now = coll.gin_bytes_sent();
            per_op.push(now - mark);
            mark = now;
        };
        let out = comm.device().alloc::<f32>(len).unwrap();
        coll.all_reduce(Operand::range(&send, 0, len).unwrap(), &out, Op::Sum, stream).unwrap();
        coll.synchronize(stream).unwrap();
        step("all_reduce", stream.read_vec(&out).unwrap(), &sum);
        coll.reduce_scatter(&send, &out, Op::Sum, stream).unwrap();
        coll.synchronize(stream).unwrap();
        step("reduce_scatter", stream.read_vec(&out).unwrap(), &|i| sum(me * len + i));
        let all = comm.device().alloc::<f32>(n * len).unwrap();
        coll.all_gather(Operand::range(&send, 0, len).unwrap(), &all, stream).unwrap();
        coll.synchronize(stream).unwrap();
        let got = stream.read_vec(&all).unwrap();
        let want: Vec<f32> = (0..n).flat_map(|q| ins[q][..len].to_vec()).collect();
        assert_eq!(got, want, "all_gather ({mode:?})");
        step("all_gather", vec![], &sum);
        let src = if me == 0 { Operand::range(&send, 0, len).unwrap() } else { Operand::null() };
        coll.broadcast(src, &out, 0, stream).unwrap();
        coll.synchronize(stream).unwrap();
        assert_eq!(stream.read_vec(&out).unwrap(), ins[0][..len].to_vec(), "broadcast ({mode:?})");
        step("broadcast", vec![], &sum);
        let root = n - 1;
        let dst = if me == root { Operand::from(&out) } else { Operand::null() };
        coll.reduce(Operand::range(&send, 0, len).unwrap(), dst, Op::Sum, root, stream).unwrap();
        coll.synchronize(stream).unwrap();
        let got = if me == root { stream.read_vec(&out).unwrap() } else { vec![] };
        step("reduce", got, &sum);
        bytes.push(per_op);
        drop(coll);
    }
    let block = len as u64 * s;
    let (remote, rail) = ((n - l) as u64, (t - 1) as u64);
    let other_team = me / l != (n - 1) / l;
    let flat = [
        remote * block,
        remote * block,
        remote * block,
        if me == 0 { remote * block } else { 0 },
        if other_team { block } else { 0 },
    ];
    // All-reduce along the rail: the shard (`len / l` elements) to every
    // other team with two teams; with more, a reduce-scatter (every piece
    // but its own, once) and an all-gather (its own piece to each).
    let shard = (len / l) as u64;
    let piece = shard / t as u64 + u64::from(((me / l) as u64) < shard % t as u64);
    let rail_all_reduce = if t > 2 { (shard - piece) + rail * piece } else { rail * shard };
    let hier = [
        rail_all_reduce * s,
        rail * block,
        rail * block,
        if me == 0 { rail * block } else { 0 },
        if other_team && me % l == (n - 1) % l { block } else { 0 },
    ];
    assert_eq!(bytes[0], flat, "rank {me}: flat GIN bytes (all_reduce, reduce_scatter, all_gather, broadcast, reduce)");
    assert_eq!(bytes[1], hier, "rank {me}: hierarchical GIN bytes");
    let (f, h): (u64, u64) = (bytes[0].iter().sum(), bytes[1].iter().sum());
    assert!(h * l as u64 <= f, "rank {me}: hierarchical {h} GIN bytes, flat {f}");
    comm.finalize().unwrap();
}

#[test]
fn coll_hierarchical_moves_fewer_gin_bytes() {
    let mut env = slow().to_vec();
    env.push(("DEVCOMM_LSA_SIZE", "2".to_string()));
    common::run_on_runtime("child_coll_gin_bytes", 4, &env);
}

/// The same on 4 teams of 2 (the rail all-reduce as reduce-scatter +
/// all-gather).
#[test]
fn coll_hierarchical_moves_fewer_gin_bytes_4_teams() {
    let mut env = slow().to_vec();
    env.push(("DEVCOMM_LSA_SIZE", "2".to_string()));
    common::run_on_runtime("child_coll_gin_bytes", 8, &env);
}
