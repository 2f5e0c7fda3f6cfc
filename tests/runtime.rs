//! The runtime layer on whichever runtime `DEVCOMM_RUNTIME` selects: kernels
//! written once run with the right results, block barriers and shared memory
//! work, faults and bad launches are errors.

use devcomm::runtime::LaunchConfig;
use devcomm::Error;
use devcomm_kernels::selftest::{axpy_f32, block_sum_u64, coop_sync_max, geometry, trap_at};
use devcomm_tests::test_device;

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
    unsafe { s.launch::<geometry>(cfg, (out.as_mut_ptr(),)) }.unwrap();
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
        let r = unsafe { s.launch::<trap_at>(cfg, (out.as_mut_ptr(), u32::MAX)) };
        assert!(matches!(r, Err(Error::InvalidArgument(_))), "{cfg:?}: {r:?}");
    }
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
    unsafe { s.launch::<trap_at>(LaunchConfig::new(2, 32), (out.as_mut_ptr(), 37)) }.unwrap();
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
        // SAFETY: four zeroed words; the grid is small enough to be co-resident.
        unsafe {
            s.launch::<devcomm_kernels::selftest::atomics_smoke>(
                LaunchConfig::new(blocks, threads),
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
        s.launch::<devcomm_kernels::selftest::coop_check>(
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
        s.launch::<devcomm_kernels::selftest::warp_intrinsics>(LaunchConfig::new(blocks, threads), (out.as_mut_ptr(),))
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
    use devcomm_kernels::lsa::{lsa_copy, lsa_copy_bulk};
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
                    s.launch::<lsa_copy>(
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
                        s.launch::<lsa_copy_bulk>(
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
    let threads = 160u32;
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
                s.launch::<coop_sync_max>(
                    LaunchConfig::new(1, threads),
                    (kind, d_values.as_ptr(), d_max.as_mut_ptr(), d_agreed.as_mut_ptr()),
                )
            }
            .unwrap();
            let (max, agreed) = (s.read_vec(&d_max).unwrap(), s.read_vec(&d_agreed).unwrap());
            for t in 0..threads {
                let (ti, what) = (t as usize, format!("kind {kind} trial {trial} thread {t}"));
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
