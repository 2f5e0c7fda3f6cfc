//! The runtime layer on whichever runtime `DEVCOMM_RUNTIME` selects: kernels
//! written once run with the right results, block barriers and shared memory
//! work, faults and bad launches are errors.

use devcomm::runtime::LaunchConfig;
use devcomm::Error;
use devcomm_kernels::util::{axpy_f32, block_sum_u64};
use devcomm_test_kernels::selftest::{coop_sync_max, geometry, trap_at};
use devcomm_tests::{test_device, test_kernels};

mod common;
use rand::{Rng, SeedableRng};

#[test]
fn axpy_matches_host_reference_on_odd_sizes() {
    let dev = test_device(0);
    let s = dev.stream();
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    for &n in &[1usize, 31, 1000, 4099] {
        let x: Vec<f32> = (0..n).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let y: Vec<f32> = (0..n).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let a = rng.gen_range(-4.0f32..4.0);
        let dx = dev.alloc_from(&x).unwrap();
        let dy = dev.alloc_from(&y).unwrap();
        let mut out = dev.alloc::<f32>(n + 1).unwrap();
        s.memset(&mut out, 0xFF).unwrap(); // poison: NaN everywhere
                                           // Fewer threads than elements: exercises the grid-stride loop.
        let cfg = LaunchConfig::new(3, 64);
        // SAFETY: all buffers hold at least n elements and live past synchronize.
        unsafe { s.launch::<axpy_f32>(cfg, (a, dx.as_ptr(), dy.as_ptr(), out.as_mut_ptr(), n as u32)) }.unwrap();
        let got = s.read_vec(&out).unwrap();
        for i in 0..n {
            let want = (a as f64) * (x[i] as f64) + (y[i] as f64);
            assert!((got[i] as f64 - want).abs() <= 1e-5 * want.abs().max(1.0), "n={n} i={i}: {} vs {want}", got[i]);
        }
        assert!(got[n].is_nan(), "element past n was written");
    }
}

#[test]
fn block_barriers_and_shared_memory_give_the_right_sums() {
    let dev = test_device(0);
    let s = dev.stream();
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    for &(blocks, threads, n) in &[(1u32, 1u32, 1u32), (3, 32, 77), (5, 128, 1001), (2, 256, 300)] {
        let input: Vec<u64> = (0..n).map(|_| rng.gen()).collect();
        let din = dev.alloc_from(&input).unwrap();
        let mut sums = dev.alloc::<u64>(blocks as usize).unwrap();
        let mut echo = dev.alloc::<u64>((blocks * threads) as usize).unwrap();
        s.memset(&mut sums, 0xA5).unwrap();
        s.memset(&mut echo, 0xA5).unwrap();
        let cfg = LaunchConfig::new(blocks, threads).with_shared_mem(threads * 8);
        // SAFETY: sizes as the kernel's contract requires.
        unsafe { s.launch::<block_sum_u64>(cfg, (din.as_ptr(), n, sums.as_mut_ptr(), echo.as_mut_ptr())) }.unwrap();
        let got_sums = s.read_vec(&sums).unwrap();
        let got_echo = s.read_vec(&echo).unwrap();
        for b in 0..blocks {
            let vals: Vec<u64> = (0..threads).map(|t| input[((b * threads + t) % n) as usize]).collect();
            let want = vals.iter().fold(0u64, |a, v| a.wrapping_add(*v));
            assert_eq!(got_sums[b as usize], want, "block {b} of {blocks}x{threads}");
            for t in 0..threads {
                assert_eq!(got_echo[(b * threads + t) as usize], vals[(threads - 1 - t) as usize], "echo b{b} t{t}");
            }
        }
    }
}

#[test]
fn multi_dimensional_launch_geometry() {
    let dev = test_device(0);
    let s = dev.stream();
    let (grid, block) = ((2u32, 3u32, 2u32), (4u32, 2u32, 3u32));
    let cfg = LaunchConfig::new(grid, block);
    let total = (2 * 3 * 2 * 4 * 2 * 3) as usize;
    let mut out = dev.alloc::<u32>(total * 6).unwrap();
    s.memset(&mut out, 0xFF).unwrap();
    // SAFETY: 6 words per thread.
    unsafe { s.launch_in::<geometry>(&test_kernels(&dev), cfg, (out.as_mut_ptr(),)) }.unwrap();
    let got = s.read_vec(&out).unwrap();
    let mut slot = 0;
    for bz in 0..grid.2 {
        for by in 0..grid.1 {
            for bx in 0..grid.0 {
                for tz in 0..block.2 {
                    for ty in 0..block.1 {
                        for tx in 0..block.0 {
                            assert_eq!(&got[slot * 6..slot * 6 + 6], &[tx, ty, tz, bx, by, bz], "slot {slot}");
                            slot += 1;
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn bad_launch_configs_are_invalid_arguments() {
    let dev = test_device(0);
    let s = dev.stream();
    let out = dev.alloc::<u32>(4).unwrap();
    for cfg in [
        LaunchConfig::new(0, 32),
        LaunchConfig::new(1, 0),
        LaunchConfig::new(1, 2048),
        LaunchConfig::new(1, (32, 32, 2)),
        LaunchConfig::new(1, 32).with_shared_mem(LaunchConfig::MAX_SHARED_MEM_BYTES + 1),
    ] {
        // SAFETY: rejected before launch.
        let r = unsafe { s.launch_in::<trap_at>(&test_kernels(&dev), cfg, (out.as_mut_ptr(), u32::MAX)) };
        assert!(matches!(r, Err(Error::InvalidArgument(_))), "{cfg:?}: {r:?}");
    }
    s.synchronize().unwrap();
}

/// A co-resident launch runs when its grid fits at once, and is refused
/// (a launch error, the stream still usable) when it cannot, on both runtimes.
#[test]
fn co_resident_launches_run_the_whole_grid_or_are_refused() {
    use devcomm_kernels::util::axpy_f32;
    let dev = test_device(0);
    let s = dev.new_stream().unwrap();
    let n = 4 * 64;
    let x = dev.alloc_from(&vec![1.0f32; n]).unwrap();
    let y = dev.alloc_from(&vec![2.0f32; n]).unwrap();
    let out = dev.alloc::<f32>(n).unwrap();
    let args = (3.0f32, x.as_ptr(), y.as_ptr(), out.as_mut_ptr(), n as u32);
    // SAFETY: x, y and out hold n elements and outlive the reads below.
    unsafe { s.launch::<axpy_f32>(LaunchConfig::new(4, 64).co_resident(), args) }.unwrap();
    assert_eq!(s.read_vec(&out).unwrap(), vec![5.0f32; n]);
    // A million blocks of 1024 threads are never resident at once.
    let huge = LaunchConfig::new(1 << 20, 1024).co_resident();
    // SAFETY: refused before anything runs (and it would only touch n elements).
    let e = unsafe { s.launch::<axpy_f32>(huge, args) }.unwrap_err();
    assert!(matches!(e, Error::CudaError(_)), "{e}");
    // SAFETY: as for the first launch.
    unsafe { s.launch::<axpy_f32>(LaunchConfig::new(4, 64), args) }.unwrap();
    s.synchronize().unwrap();
}

#[test]
fn size_mismatched_copies_are_invalid_arguments() {
    let dev = test_device(0);
    let mut buf = dev.alloc::<u32>(4).unwrap();
    let s = dev.stream();
    assert!(matches!(s.write(&mut buf, &[1, 2, 3]), Err(Error::InvalidArgument(_))));
    let mut small = [0u32; 2];
    assert!(matches!(s.read(&buf, &mut small), Err(Error::InvalidArgument(_))));
}

#[test]
fn a_trapping_kernel_is_an_error_not_a_hang() {
    // A trap destroys a CUDA context (and this process's primary context
    // with it), so the kernel runs in a process of its own, on either runtime.
    common::run_on_runtime("child_trap", 1, &[]);
}

/// Child: launches a kernel that traps; the launch's stream reports an error
/// naming the kernel, and keeps reporting it.
#[test]
#[ignore = "a rank of a multi-rank test: its parent runs it"]
fn child_trap() {
    if !common::is_child("child_trap") {
        return;
    }
    let dev = test_device(0);
    let s = dev.new_stream().unwrap();
    let out = dev.alloc::<u32>(64).unwrap();
    // SAFETY: 64 elements for 2x32 threads.
    unsafe { s.launch_in::<trap_at>(&test_kernels(&dev), LaunchConfig::new(2, 32), (out.as_mut_ptr(), 37)) }.unwrap();
    let err = s.synchronize().unwrap_err();
    let named = match (&err, dev.kind()) {
        // The emulator knows which kernel trapped.
        (Error::CudaError(m), devcomm::RuntimeKind::Emulated) => m.contains("trap_at") && m.contains("trap"),
        // The driver reports an illegal instruction / launch failure.
        (Error::CudaError(m), _) => !m.is_empty(),
        _ => false,
    };
    assert!(named, "{err}");
    // Sticky, as on a GPU.
    assert!(s.synchronize().is_err());
}

#[test]
fn scoped_atomics_count_and_publish() {
    let dev = test_device(0);
    let s = dev.stream();
    for &(blocks, threads) in &[(1u32, 1u32), (4, 32), (3, 96)] {
        let counter = dev.alloc_from(&[0u64]).unwrap();
        let arrivals = dev.alloc_from(&[0u32]).unwrap();
        let published = dev.alloc_from(&[0u64]).unwrap();
        let failures = dev.alloc_from(&[0u32]).unwrap();
        // Every thread waits for the last one's release: the grid must be
        // resident at once (the strict emulator runs plain launches in
        // random waves, and this kernel then hangs).
        // SAFETY: four zeroed words; a co-resident launch.
        unsafe {
            s.launch_in::<devcomm_test_kernels::selftest::atomics_smoke>(
                &test_kernels(&dev),
                LaunchConfig::new(blocks, threads).co_resident(),
                (counter.as_mut_ptr(), arrivals.as_mut_ptr(), published.as_mut_ptr(), failures.as_mut_ptr()),
            )
        }
        .unwrap();
        let total = (blocks * threads) as u64;
        assert_eq!(s.read_vec(&counter).unwrap(), vec![3 * total]);
        assert_eq!(s.read_vec(&arrivals).unwrap(), vec![total as u32]);
        assert_eq!(s.read_vec(&failures).unwrap(), vec![0]);
    }
}

#[test]
fn every_coop_has_the_right_ranks_sizes_and_barriers() {
    let dev = test_device(0);
    let s = dev.stream();
    let blocks = 3u32;
    let failures = dev.alloc_from(&[0u32; 5]).unwrap();
    let sizes = dev.alloc_from(&[0u32; 5]).unwrap();
    // SAFETY: 128 threads, 2560 bytes of shared memory, 5 zeroed words each.
    unsafe {
        s.launch_in::<devcomm_test_kernels::selftest::coop_check>(
            &test_kernels(&dev),
            LaunchConfig::new(blocks, 128).with_shared_mem(2560),
            (failures.as_mut_ptr(), sizes.as_mut_ptr()),
        )
    }
    .unwrap();
    assert_eq!(s.read_vec(&failures).unwrap(), vec![0; 5]);
    // Leaders per block: 4 warps, 16 tiles, 4 lane sets, 1 span, 1 CTA.
    let b = blocks;
    assert_eq!(s.read_vec(&sizes).unwrap(), vec![b * 4 * 32, b * 16 * 8, b * 4 * 16, b * 64, b * 128]);
}

#[test]
fn warp_match_shuffle_and_active_mask_agree_with_the_host() {
    let dev = test_device(0);
    let s = dev.stream();
    let (blocks, threads) = (2u32, 96u32);
    let n = (blocks * threads) as usize;
    let out = dev.alloc_from(&vec![u64::MAX; 3 * n]).unwrap();
    // SAFETY: 3 words per thread; 96 threads is a multiple of 32.
    unsafe {
        s.launch_in::<devcomm_test_kernels::selftest::warp_intrinsics>(
            &test_kernels(&dev),
            LaunchConfig::new(blocks, threads),
            (out.as_mut_ptr(),),
        )
    }
    .unwrap();
    let got = s.read_vec(&out).unwrap();
    for t in 0..n {
        let (lane, w) = ((t % threads as usize) % 32, (t % threads as usize) / 32);
        let same_mod3 = (0..32).filter(|l| l % 3 == lane % 3).fold(0u64, |m, l| m | 1 << l);
        assert_eq!(got[3 * t], same_mod3, "match_any, thread {t}");
        let src = (lane + 5) % 32;
        assert_eq!(got[3 * t + 1], src as u64 * 7 + 1000 * w as u64 + (1 << 40), "shfl, thread {t}");
        let odd = if lane % 2 == 1 {
            (0..32).filter(|l| l % 2 == 1 && l / 8 == lane / 8).fold(0u64, |m, l| m | 1 << l)
        } else {
            0
        };
        assert_eq!(got[3 * t + 2], odd | 1 << 32, "partial match_any / active_mask, thread {t}");
    }
}

#[test]
fn lsa_copy_handles_every_alignment_and_tail() {
    use devcomm_test_kernels::lsa::{lsa_copy, lsa_copy_bulk};
    let dev = test_device(0);
    let s = dev.stream();
    let mut rng = rand::rngs::StdRng::seed_from_u64(23);
    let cap = 70_000usize;
    let src_data: Vec<u8> = (0..cap + 64).map(|_| rng.gen()).collect();
    let src = dev.alloc_from(&src_data).unwrap();
    let mut dst = dev.alloc::<u8>(cap + 64).unwrap();
    for &bytes in &[0usize, 1, 15, 16, 17, 255, 1000, 4096, 65_537, 69_999] {
        for &(so, dof) in &[(0usize, 0usize), (16, 32), (1, 0), (0, 8), (3, 7)] {
            for &blocks in &[1u32, 3] {
                s.memset(&mut dst, 0xEE).unwrap();
                // SAFETY: offsets + bytes stay inside both buffers; they do not overlap.
                unsafe {
                    s.launch_in::<lsa_copy>(
                        &test_kernels(&dev),
                        LaunchConfig::new(blocks, 64),
                        (dst.as_mut_ptr().add(dof), src.as_ptr().add(so), bytes as u64),
                    )
                }
                .unwrap();
                let got = s.read_vec(&dst).unwrap();
                assert_eq!(&got[dof..dof + bytes], &src_data[so..so + bytes], "bytes {bytes} src+{so} dst+{dof}");
                assert!(got[..dof].iter().all(|&b| b == 0xEE), "wrote before dst");
                assert!(got[dof + bytes..].iter().all(|&b| b == 0xEE), "wrote past the end");
                // The bulk-copy path: several chunk sizes and pipeline depths.
                for &(chunk, stages) in &[(48u32, 2u32), (4096, 3), (16384, 4)] {
                    s.memset(&mut dst, 0xEE).unwrap();
                    let smem = devcomm_device::lsa::ops::copy_bulk_smem_bytes(chunk, stages);
                    // SAFETY: as above; `smem` bytes of shared memory for the pipeline.
                    unsafe {
                        s.launch_in::<lsa_copy_bulk>(
                            &test_kernels(&dev),
                            LaunchConfig::new(blocks, 32).with_shared_mem(smem),
                            (dst.as_mut_ptr().add(dof), src.as_ptr().add(so), bytes as u64, chunk, stages),
                        )
                    }
                    .unwrap();
                    let got = s.read_vec(&dst).unwrap();
                    let what = format!("bulk {chunk}x{stages}: bytes {bytes} src+{so} dst+{dof}");
                    assert_eq!(&got[dof..dof + bytes], &src_data[so..so + bytes], "{what}");
                    assert!(
                        got[..dof].iter().all(|&b| b == 0xEE) && got[dof + bytes..].iter().all(|&b| b == 0xEE),
                        "{what}"
                    );
                }
            }
        }
    }
}

/// Every thread of a coop gets the same answer from a reducing barrier and
/// the same error from `Coop::agree`, for every coop kind.
#[test]
fn every_thread_of_a_coop_sees_the_same_max_and_the_same_error() {
    let dev = test_device(0);
    let s = dev.stream();
    let mut rng = rand::rngs::StdRng::seed_from_u64(12);
    // 5 whole warps; 3 warps and 4 lanes (a partial last warp); 32 warps
    // (every warp's slot of the block-wide maximum).
    for threads in [160u32, 100, 1024] {
        every_coop_agrees(&dev, s, &mut rng, threads);
    }
}

fn every_coop_agrees(dev: &devcomm::Device, s: &devcomm::Stream, rng: &mut rand::rngs::StdRng, threads: u32) {
    // Groups of threads per coop kind: which threads form one coop.
    let group_of = |kind: u32, t: u32| -> Option<u32> {
        match kind {
            0 => Some(t),
            1 => Some(t / 32),
            2 => Some(t / 8),
            3 => (0x0f0f_0f0fu32 & (1 << (t % 32)) != 0).then_some(t / 32),
            4 => (32..96).contains(&t).then_some(0),
            _ => Some(0),
        }
    };
    for kind in 0..6u32 {
        for trial in 0..4 {
            // Mostly zeros and small values (the fast path), some large, some errors.
            let values: Vec<u32> = (0..threads)
                .map(|_| match rng.gen_range(0..10) {
                    0..=5 => 0,
                    6..=8 => rng.gen_range(1..100),
                    _ => rng.gen(),
                })
                .map(|v: u32| if trial == 0 { (v / 77).wrapping_mul(77) } else { v }) // trial 0: no errors (multiples of 77)
                .collect();
            let d_values = dev.alloc_from(&values).unwrap();
            let poison = vec![0xDEAD_BEEFu32; threads as usize];
            let d_max = dev.alloc_from(&poison).unwrap();
            let d_agreed = dev.alloc_from(&poison).unwrap();
            // SAFETY: one block; the buffers hold `threads` elements.
            unsafe {
                s.launch_in::<coop_sync_max>(
                    &test_kernels(dev),
                    LaunchConfig::new(1, threads),
                    (kind, d_values.as_ptr(), d_max.as_mut_ptr(), d_agreed.as_mut_ptr()),
                )
            }
            .unwrap();
            let (max, agreed) = (s.read_vec(&d_max).unwrap(), s.read_vec(&d_agreed).unwrap());
            for t in 0..threads {
                let (ti, what) = (t as usize, format!("{threads} threads, kind {kind} trial {trial} thread {t}"));
                let Some(g) = group_of(kind, t) else {
                    assert_eq!((max[ti], agreed[ti]), (0xDEAD_BEEF, 0xDEAD_BEEF), "{what}: sat out");
                    continue;
                };
                let members: Vec<u32> =
                    (0..threads).filter(|&u| group_of(kind, u) == Some(g)).map(|u| values[u as usize]).collect();
                assert_eq!(max[ti], *members.iter().max().unwrap(), "{what}: max");
                let want = if members.iter().any(|v| v % 11 == 5) {
                    2
                } else if members.iter().any(|v| v % 7 == 3) {
                    1
                } else {
                    values[ti]
                };
                assert_eq!(agreed[ti], want, "{what}: agreed result");
            }
        }
    }
}

/// The test kernels are a kernel crate of their own (`devcomm-test-kernels`),
/// not the library's: `launch` refuses them, the library's module does not
/// hold them, and their own module holds them and runs them.
#[test]
fn test_kernels_launch_from_their_own_module_not_the_library_s() {
    let dev = test_device(0);
    let s = dev.stream();
    let out = dev.alloc_from(&[u32::MAX; 32]).unwrap();
    let cfg = LaunchConfig::new(1, 32);
    // SAFETY: refused before anything runs (and `out` holds a word per thread anyway).
    let e = unsafe { s.launch::<trap_at>(cfg, (out.as_mut_ptr(), u32::MAX)) }.unwrap_err();
    assert!(matches!(e, Error::InvalidUsage(_)) && e.to_string().contains("devcomm_test_kernels"), "{e}");
    let library = dev.library().unwrap();
    let module = test_kernels(&dev);
    assert!(!module.is_library());
    for name in ["trap_at", "coop_check", "lsa_barrier_rounds", "gin_put_all", "gin_dispatch"] {
        assert!(module.entry_names().iter().any(|e| e == name), "{name} is not in {module:?}");
        assert!(!library.entry_names().iter().any(|e| e == name), "{name} is in the library's module: {library:?}");
    }
    // SAFETY: refused before anything runs.
    let e = unsafe { s.launch_in::<trap_at>(&library, cfg, (out.as_mut_ptr(), u32::MAX)) }.unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)) && e.to_string().contains("library module"), "{e}");
    // SAFETY: a word per thread; nobody traps.
    unsafe { s.launch_in::<trap_at>(&module, cfg, (out.as_mut_ptr(), u32::MAX)) }.unwrap();
    assert_eq!(s.read_vec(&out).unwrap(), (0..32).collect::<Vec<u32>>());
}

/// The PTX of the test kernel crate `tests/user-kernels`, as a user embeds
/// theirs (committed here, so that no nightly is needed to run the tests).
static USER_KERNELS_PTX: &str = include_str!("user-kernels/ptx/user_kernels.sm_90.ptx");

/// A user's kernels go through `launch_in` with their module, alike on both
/// runtimes; `launch` refuses them, alike on both, with an error naming
/// `launch_in`; a module that lacks the kernel is an error on both.
#[test]
fn user_kernels_launch_from_their_module_and_only_there() {
    use devcomm_test_user_kernels::sqrt_scale;
    let dev = test_device(0);
    let s = dev.stream();
    let n = 1000usize;
    let mut rng = rand::rngs::StdRng::seed_from_u64(41);
    let x: Vec<f32> = (0..n).map(|_| rng.gen_range(0.0..100.0)).collect();
    let dx = dev.alloc_from(&x).unwrap();
    let out = dev.alloc_from(&vec![0.0f32; n]).unwrap();
    let args = (dx.as_ptr(), out.as_mut_ptr(), n as u32, 2.0f32, -1.0f32);
    let cfg = LaunchConfig::for_elements(n as u32, 128);

    // `launch` is for the library's kernels only.
    // SAFETY: refused before anything runs (and the buffers are valid anyway).
    let e = unsafe { s.launch::<sqrt_scale>(cfg, args) }.unwrap_err();
    assert!(matches!(e, Error::InvalidUsage(_)), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("launch_in") && msg.contains("load_module") && msg.contains("devcomm_test_user_kernels"),
        "{msg}"
    );
    // Nor is it in the library's module.
    let library = dev.library().unwrap();
    assert!(library.is_library());
    // Its entries are the embedded PTX's on both runtimes (none when built with DEVCOMM_SKIP_PTX).
    let embedded = devcomm::ptx::embedded_kernels_ptx().is_some();
    assert_eq!(library.entry_names().iter().any(|e| e == "axpy_f32"), embedded, "{library:?}");
    // SAFETY: as above.
    let e = unsafe { s.launch_in::<sqrt_scale>(&library, cfg, args) }.unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)) && e.to_string().contains("library module"), "{e}");

    // From its own module it runs, with the same results on both runtimes.
    let module = dev.load_module(USER_KERNELS_PTX).unwrap();
    assert!(!module.is_library());
    let mut names = module.entry_names().to_vec();
    names.sort();
    assert_eq!(
        names,
        [
            "affine_struct",
            "sixteen",
            "sqrt_scale",
            "strict_flag_acquire",
            "strict_gin_given_release",
            "strict_gin_reuse_flush",
            "strict_grid_wait",
            "strict_lsa_cta_signal",
            "strict_lsa_signal",
            "strict_reuse_barrier"
        ]
    );
    // SAFETY: x and out hold n elements and live past the read below.
    unsafe { s.launch_in::<sqrt_scale>(&module, cfg, args) }.unwrap();
    let got = s.read_vec(&out).unwrap();
    for i in 0..n {
        let want = x[i].sqrt().mul_add(2.0, -1.0); // sqrt.rn and fma.rn: exact on both
        assert_eq!(got[i].to_bits(), want.to_bits(), "i={i}: {} vs {want}", got[i]);
    }

    // A library kernel launches from the library's module too, not from a user's.
    let y = dev.alloc_from(&vec![1.0f32; n]).unwrap();
    let axpy_args = (3.0f32, dx.as_ptr(), y.as_ptr(), out.as_mut_ptr(), n as u32);
    // SAFETY: x, y and out hold n elements.
    unsafe { s.launch_in::<axpy_f32>(&library, cfg, axpy_args) }.unwrap();
    assert_eq!(s.read_vec(&out).unwrap()[7], 3.0 * x[7] + 1.0);
    // SAFETY: refused before anything runs.
    let e = unsafe { s.launch_in::<axpy_f32>(&module, cfg, axpy_args) }.unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)) && e.to_string().contains("not in this module"), "{e}");
}

/// A `#[repr(C)]` struct as one kernel argument, and a kernel of sixteen
/// arguments of every width, from the user kernel crate's PTX.
#[test]
fn struct_argument_and_sixteen_arguments() {
    use devcomm_test_user_kernels::{affine_struct, sixteen, Affine};
    let dev = test_device(0);
    let s = dev.stream();
    let module = dev.load_module(USER_KERNELS_PTX).unwrap();
    let n = 300usize;
    let x: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
    let dx = dev.alloc_from(&x).unwrap();
    let out = dev.alloc_from(&vec![0.0f32; n]).unwrap();
    for flag in [0u8, 1] {
        let p = Affine { x: dx.as_ptr(), out: out.as_mut_ptr(), n: n as u32, a: 3.0, b: 0.25, flag, extra: 1000 };
        // SAFETY: x and out hold n elements.
        unsafe { s.launch_in::<affine_struct>(&module, LaunchConfig::new(2, 64), (p,)) }.unwrap();
        let got = s.read_vec(&out).unwrap();
        for i in 0..n {
            assert_eq!(got[i], x[i] * 3.0 + 0.25 + if flag != 0 { 1000.0 } else { 0.0 }, "flag {flag} i {i}");
        }
    }
    assert_eq!(<<sixteen as devcomm_device::Kernel>::Args as devcomm_device::KernelArgs>::COUNT, 16);
    let o = dev.alloc_from(&[0u64; 15]).unwrap();
    let args = (
        o.as_mut_ptr(),
        201u8,
        60_001u16,
        4_000_000_001u32,
        u64::MAX - 5,
        -7i8,
        -30_000i16,
        -2_000_000_000i32,
        -(1i64 << 50),
        12.75f32,
        1e15f64,
        17u32,
        1u64 << 63,
        255u8,
        0xdead_beefu32,
        0x0123_4567_89ab_cdefu64,
    );
    // SAFETY: o holds 15 elements.
    unsafe { s.launch_in::<sixteen>(&module, LaunchConfig::new(1, 32), args) }.unwrap();
    let want: [u64; 15] = [
        201,
        60_001,
        4_000_000_001,
        u64::MAX - 5,
        -7i64 as u64,
        -30_000i64 as u64,
        -2_000_000_000i64 as u64,
        -(1i64 << 50) as u64,
        12,
        1_000_000_000_000_000,
        17,
        1 << 63,
        255,
        0xdead_beef,
        0x0123_4567_89ab_cdef,
    ];
    assert_eq!(s.read_vec(&o).unwrap(), want);
}

/// `devcomm_device::math` on random data against the host's `std`: exact
/// where PTX is exact (sqrt, fma, min, max); where the GPU approximates
/// (rsqrt, exp, log, exp2, log2) within a few times its instructions' error
/// bounds (2^-22 relative or absolute: 1e-6 here; exp: 4e-6, as the
/// rounding of `y * log2(e)` adds `|y| * 2^-24`).
#[test]
fn device_math_matches_the_host() {
    use devcomm_test_kernels::selftest::{math_f32, math_f64, MATH_F32_OUTPUTS, MATH_F64_OUTPUTS};
    let dev = test_device(0);
    let s = dev.stream();
    let mut rng = rand::rngs::StdRng::seed_from_u64(43);
    let n = 5000usize;
    // x > 0 spanning many binades (sqrt, log), y in [-20, 20] (exp), z anything moderate.
    let x: Vec<f32> = (0..n).map(|_| 2f32.powf(rng.gen_range(-60.0..60.0)) * rng.gen_range(1.0..2.0)).collect();
    let y: Vec<f32> = (0..n).map(|_| rng.gen_range(-20.0..20.0)).collect();
    let z: Vec<f32> = (0..n).map(|_| rng.gen_range(-1e3..1e3)).collect();
    let (dx, dy, dz) = (dev.alloc_from(&x).unwrap(), dev.alloc_from(&y).unwrap(), dev.alloc_from(&z).unwrap());
    let out = dev.alloc_from(&vec![0.0f32; n * MATH_F32_OUTPUTS]).unwrap();
    // SAFETY: inputs hold n elements, out 10 n.
    unsafe {
        s.launch_in::<math_f32>(
            &test_kernels(&dev),
            LaunchConfig::new(4, 128),
            (dx.as_ptr(), dy.as_ptr(), dz.as_ptr(), out.as_mut_ptr(), n as u32),
        )
    }
    .unwrap();
    let got = s.read_vec(&out).unwrap();
    let close = |g: f32, w: f64, rel: f64, abs: f64, what: &str, i: usize| {
        assert!((g as f64 - w).abs() <= rel * w.abs() + abs, "{what}, element {i}: {g:e} vs {w:e}");
    };
    for i in 0..n {
        let (a, b, c) = (x[i], y[i], z[i]);
        let r = &got[i * MATH_F32_OUTPUTS..][..MATH_F32_OUTPUTS];
        assert_eq!(r[0].to_bits(), a.sqrt().to_bits(), "sqrt({a:e}), element {i}");
        close(r[1], 1.0 / (a as f64).sqrt(), 1e-6, 0.0, "rsqrt", i);
        // ex2.approx: 2 ulp, plus the rounding of y * log2(e) (|y| <= 20).
        close(r[2], (b as f64).exp(), 4e-6, 0.0, "exp", i);
        // lg2.approx: 2^-22 absolute near 1, 2 ulp elsewhere.
        close(r[3], (a as f64).ln(), 1e-6, 1e-6, "log", i);
        close(r[4], (b as f64).exp2(), 1e-6, 0.0, "exp2", i);
        close(r[5], (a as f64).log2(), 1e-6, 1e-6, "log2", i);
        assert_eq!(r[6].to_bits(), a.mul_add(b, c).to_bits(), "fma({a:e}, {b:e}, {c:e}), element {i}");
        assert_eq!(r[7], b.min(c), "min, element {i}");
        assert_eq!(r[8], b.max(c), "max, element {i}");
        assert!(r[9].is_nan(), "sqrt(-{a:e}), element {i}: {}", r[9]);
    }

    let xd: Vec<f64> = x.iter().map(|&v| v as f64 * rng.gen_range(1.0..2.0)).collect();
    let yd: Vec<f64> = (0..n).map(|_| rng.gen_range(-1e6..1e6)).collect();
    let zd: Vec<f64> = (0..n).map(|_| rng.gen_range(-1e12..1e12)).collect();
    let (dx, dy, dz) = (dev.alloc_from(&xd).unwrap(), dev.alloc_from(&yd).unwrap(), dev.alloc_from(&zd).unwrap());
    let out = dev.alloc_from(&vec![0.0f64; n * MATH_F64_OUTPUTS]).unwrap();
    // SAFETY: inputs hold n elements, out 5 n.
    unsafe {
        s.launch_in::<math_f64>(
            &test_kernels(&dev),
            LaunchConfig::new(4, 128),
            (dx.as_ptr(), dy.as_ptr(), dz.as_ptr(), out.as_mut_ptr(), n as u32),
        )
    }
    .unwrap();
    let got = s.read_vec(&out).unwrap();
    for i in 0..n {
        let (a, b, c) = (xd[i], yd[i], zd[i]);
        let r = &got[i * MATH_F64_OUTPUTS..][..MATH_F64_OUTPUTS];
        assert_eq!(r[0].to_bits(), a.sqrt().to_bits(), "sqrt_f64({a:e}), element {i}");
        // rsqrt.approx.f64: an estimate without a documented bound; at least
        // single precision is expected (to be confirmed on a GPU).
        let w = 1.0 / a.sqrt();
        assert!((r[1] - w).abs() <= 1e-6 * w, "rsqrt_f64({a:e}), element {i}: {:e} vs {w:e}", r[1]);
        assert_eq!(r[2].to_bits(), a.mul_add(b, c).to_bits(), "fma_f64({a:e}, {b:e}, {c:e}), element {i}");
        assert_eq!(r[3], b.min(c), "min_f64, element {i}");
        assert_eq!(r[4], b.max(c), "max_f64, element {i}");
    }
}

/// `F16`'s conversions on the device (the hardware's `cvt` on a GPU)
/// against the integer ones the host and the emulator run: every f16 code
/// to f32, and to f16 every code's value, the midpoints between
/// neighbouring codes (ties to even), values next to them, the subnormal
/// range, overflow, infinities, and random f32s over every binade. Exact;
/// a NaN only has to stay a NaN (the hardware's is canonical).
#[test]
fn f16_conversions_match_the_host() {
    use devcomm_device::coll::F16;
    use devcomm_test_kernels::selftest::f16_conversions;
    let dev = test_device(0);
    let s = dev.stream();
    let mut rng = rand::rngs::StdRng::seed_from_u64(47);
    let mut x: Vec<f32> = Vec::new();
    for code in 0..=u16::MAX {
        let v = F16(code).to_f32_soft();
        let next = F16(code.wrapping_add(1)).to_f32_soft();
        x.push(v);
        if v.is_finite() && next.is_finite() {
            let mid = ((v as f64 + next as f64) / 2.0) as f32; // exact: f16 midpoints fit f32
            x.extend([mid, f32::from_bits(mid.to_bits() - 1), f32::from_bits(mid.to_bits() + 1)]);
        }
    }
    x.extend([
        65504.0,
        65519.0,
        65520.0,
        1e6,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::MAX,
        f32::MIN_POSITIVE,
        1e-10,
        -1e-10,
    ]);
    x.extend((0..20_000).map(|_| f32::from_bits(rng.gen::<u32>())));
    x.extend((0..20_000).map(|_| rng.gen_range(-1.0f32..1.0) * 2f32.powi(rng.gen_range(-30..20))));
    let n = x.len();
    let dx = dev.alloc_from(&x).unwrap();
    let wide = dev.alloc_from(&vec![0xdead_beefu32; 65536]).unwrap();
    let narrow = dev.alloc_from(&vec![0xdead_beefu32; n]).unwrap();
    // SAFETY: `wide` holds 65536 elements, `dx` and `narrow` n.
    unsafe {
        s.launch_in::<f16_conversions>(
            &test_kernels(&dev),
            LaunchConfig::new(64, 256),
            (dx.as_ptr(), n as u32, wide.as_mut_ptr(), narrow.as_mut_ptr()),
        )
    }
    .unwrap();
    let (wide, narrow) = (s.read_vec(&wide).unwrap(), s.read_vec(&narrow).unwrap());
    for (code, &got) in wide.iter().enumerate() {
        let want = F16(code as u16).to_f32_soft();
        if want.is_nan() {
            assert!(f32::from_bits(got).is_nan(), "f16 {code:#06x}: {got:#010x}, not a NaN");
        } else {
            assert_eq!(got, want.to_bits(), "f16 {code:#06x} to f32: {} vs {want}", f32::from_bits(got));
        }
    }
    for (i, (&v, &got)) in x.iter().zip(&narrow).enumerate() {
        assert!(got <= 0xffff, "element {i}: {got:#x} is not a 16-bit code");
        let want = F16::from_f32_soft(v).0;
        if v.is_nan() {
            assert!(F16(got as u16).to_f32_soft().is_nan(), "f32 NaN {:#010x}: f16 {got:#06x}", v.to_bits());
        } else {
            assert_eq!(got as u16, want, "{v:e} ({:#010x}) to f16, element {i}", v.to_bits());
        }
    }
}

/// Warp, tile and block reductions (sum, max, a custom op) on every thread,
/// over full and partial warps, against host results.
#[test]
fn warp_tile_and_block_reductions_match_the_host() {
    use devcomm_test_kernels::selftest::{reductions, REDUCTION_OUTPUTS as K};
    let dev = test_device(0);
    let s = dev.stream();
    let mut rng = rand::rngs::StdRng::seed_from_u64(47);
    for &(blocks, threads) in &[(1u32, 32u32), (3, 96), (2, 100), (1, 1), (2, 33), (1, 1024)] {
        let total = (blocks * threads) as usize;
        let fx: Vec<f32> = (0..total).map(|_| rng.gen_range(-10.0..10.0)).collect();
        let ux: Vec<u32> = (0..total).map(|_| rng.gen()).collect();
        let (dfx, dux) = (dev.alloc_from(&fx).unwrap(), dev.alloc_from(&ux).unwrap());
        let fout = dev.alloc_from(&vec![f32::NAN; total * K]).unwrap();
        let uout = dev.alloc_from(&vec![u32::MAX; total * K]).unwrap();
        // SAFETY: one input and K outputs per thread; 256 bytes of shared memory.
        unsafe {
            s.launch_in::<reductions>(
                &test_kernels(&dev),
                LaunchConfig::new(blocks, threads).with_shared_mem(256),
                (dfx.as_ptr(), dux.as_ptr(), fout.as_mut_ptr(), uout.as_mut_ptr()),
            )
        }
        .unwrap();
        let (gf, gu) = (s.read_vec(&fout).unwrap(), s.read_vec(&uout).unwrap());
        let what = format!("{blocks} x {threads}");
        let fsum = |r: std::ops::Range<usize>| fx[r].iter().map(|&v| v as f64).sum::<f64>();
        let fmax = |r: std::ops::Range<usize>| fx[r].iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let usum = |r: std::ops::Range<usize>| ux[r].iter().fold(0u32, |a, &v| a.wrapping_add(v));
        let umax = |r: std::ops::Range<usize>| ux[r].iter().copied().max().unwrap();
        let near = |g: f32, w: f64, t: usize, k: usize| {
            assert!((g as f64 - w).abs() <= 1e-4 * (1.0 + w.abs()), "{what}: thread {t} output {k}: {g} vs {w}")
        };
        for b in 0..blocks as usize {
            let block = b * threads as usize..(b + 1) * threads as usize;
            let (bs, bm, bus, bum) =
                (fsum(block.clone()), fmax(block.clone()), usum(block.clone()), umax(block.clone()));
            let bmin = fx[block.clone()].iter().copied().fold(f32::INFINITY, f32::min);
            let bumin = ux[block.clone()].iter().copied().min().unwrap();
            let unegs = ux[block.clone()].iter().fold(0u32, |a, &v| a.wrapping_add(v.wrapping_neg()));
            let unegm = ux[block.clone()].iter().map(|v| v.wrapping_neg()).max().unwrap();
            let first = gf[block.start * K + 3];
            for t in block.clone() {
                let (f, u) = (&gf[t * K..][..K], &gu[t * K..][..K]);
                let rank = t - block.start;
                if (rank / 32 + 1) * 32 <= threads as usize {
                    let warp = block.start + rank / 32 * 32..block.start + rank / 32 * 32 + 32;
                    let tile = block.start + rank / 8 * 8..block.start + rank / 8 * 8 + 8;
                    near(f[0], fsum(warp.clone()), t, 0);
                    assert_eq!(f[1], fmax(warp.clone()), "{what}: warp max, thread {t}");
                    near(f[2], fsum(tile.clone()), t, 2);
                    assert_eq!(u[..3], [usum(warp.clone()), umax(warp), usum(tile)], "{what}: thread {t}");
                    // Every lane of a warp has the same bits.
                    assert_eq!(f[0].to_bits(), gf[warp_first(t, block.start) * K].to_bits(), "{what}: thread {t}");
                }
                near(f[3], bs, t, 3);
                assert_eq!(f[3].to_bits(), first.to_bits(), "{what}: block sums differ between threads ({t})");
                assert_eq!(f[4], bm, "{what}: block max, thread {t}");
                near(f[5], -bs, t, 5);
                assert_eq!(f[6], -bmin, "{what}: block max of -x, thread {t}");
                assert_eq!(f[7], bmin, "{what}: block min, thread {t}");
                assert_eq!(u[3..], [bus, bum, unegs, unegm, bumin], "{what}: thread {t}");
            }
        }
    }
}

/// The first thread of `t`'s warp (its block starts at `block_start`).
fn warp_first(t: usize, block_start: usize) -> usize {
    block_start + (t - block_start) / 32 * 32
}

/// Graph capture misuse is the same typed error on both runtimes, and a
/// capture survives it: ending a capture that never began, beginning one
/// twice. The graph then replays what was captured, with the inputs of
/// each launch.
#[test]
fn graph_capture_misuse_is_refused_alike_and_the_graph_replays() {
    let dev = test_device(0);
    let s = dev.new_stream().unwrap();
    let usage = |r: devcomm::Result<()>, what: &str| match r {
        Err(Error::InvalidUsage(m)) => assert!(m.contains("captur"), "{what}: {m}"),
        other => panic!("{what}: expected InvalidUsage, got {other:?}"),
    };
    usage(s.end_capture().map(|_| ()), "end_capture without begin_capture");
    assert!(!s.is_capturing().unwrap());
    let n = 777usize;
    let x = dev.alloc_from(&vec![1.5f32; n]).unwrap();
    let mut y = dev.alloc::<f32>(n).unwrap();
    let cfg = LaunchConfig::for_elements(n as u32, 128);
    s.begin_capture().unwrap();
    assert!(s.is_capturing().unwrap());
    usage(s.begin_capture(), "begin_capture twice");
    // SAFETY: x and y hold n elements and outlive every launch of the graph.
    unsafe { s.launch::<axpy_f32>(cfg, (2.0, x.as_ptr(), y.as_ptr(), y.as_mut_ptr(), n as u32)) }.unwrap();
    let graph = s.end_capture().unwrap();
    assert!(!s.is_capturing().unwrap());
    for start in [0.25f32, -3.0, 7.0] {
        s.write(&mut y, &vec![start; n]).unwrap();
        // SAFETY: as above.
        unsafe { graph.launch(&s) }.unwrap();
        // SAFETY: as above.
        unsafe { graph.launch(&s) }.unwrap();
        let want = start + 2.0 * 3.0; // two launches of y = 2x + y, x = 1.5
        assert_eq!(s.read_vec(&y).unwrap(), vec![want; n], "graph launched twice from {start}");
    }
}
