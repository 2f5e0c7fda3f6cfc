//! Small kernels of general use, launched with `Stream::launch` like every
//! kernel of this crate: `axpy_f32`, and `block_sum_u64`, which also checks
//! that a runtime's block barriers and dynamic shared memory work (the
//! `hello` example launches it on every rank).

use devcomm_device::arch::{
    block_dim, block_idx, dynamic_shared, dynamic_shared_size, global_thread_x, grid_threads_x, sync_threads,
    thread_idx,
};
use devcomm_device::kernel;

kernel! {
    /// `out[i] = a * x[i] + y[i]` for `i < n`, grid-stride.
    ///
    /// # Safety
    /// `x`, `y` and `out` point to at least `n` elements of device memory.
    pub unsafe fn axpy_f32(a: f32, x: *const f32, y: *const f32, out: *mut f32, n: u32) {
        let mut i = global_thread_x();
        let stride = grid_threads_x();
        while i < n {
            let k = i as usize;
            *out.add(k) = a * *x.add(k) + *y.add(k);
            i += stride;
        }
    }

    /// Per-block sums and a check of block barriers and shared memory.
    ///
    /// Each block loads its `blockDim.x` elements of `input` (wrapping modulo
    /// `n`) into dynamic shared memory, reduces them with a tree of
    /// `sync_threads` barriers, and thread 0 writes the block's sum to
    /// `block_sums[blockIdx.x]`. Every thread then reads the whole block's
    /// shared data in *reverse* order after a barrier and adds what it saw to
    /// `echo[global thread]`, so a missing barrier shows up as a wrong echo.
    ///
    /// Needs `blockDim.x` a power of two and `blockDim.x * 8` bytes of dynamic
    /// shared memory.
    ///
    /// # Safety
    /// `input` has `n > 0` elements; `block_sums` has `gridDim.x` elements;
    /// `echo` has `gridDim.x * blockDim.x` elements.
    pub unsafe fn block_sum_u64(input: *const u64, n: u32, block_sums: *mut u64, echo: *mut u64) {
        let tid = thread_idx().x;
        let nthreads = block_dim().x;
        let smem = dynamic_shared::<u64>();
        if (dynamic_shared_size() as u64) < (nthreads as u64) * 8 || n == 0 {
            devcomm_device::arch::trap();
        }
        let g = global_thread_x();
        let v = *input.add((g % n) as usize);
        *smem.add(tid as usize) = v;
        sync_threads();
        // Everyone reads a value another thread wrote: needs the barrier above.
        let mirror = *smem.add((nthreads - 1 - tid) as usize);
        *echo.add(g as usize) = mirror;
        sync_threads();
        let mut width = nthreads / 2;
        while width > 0 {
            if tid < width {
                let a = *smem.add(tid as usize);
                let b = *smem.add((tid + width) as usize);
                *smem.add(tid as usize) = a.wrapping_add(b);
            }
            sync_threads();
            width /= 2;
        }
        if tid == 0 {
            *block_sums.add(block_idx().x as usize) = *smem;
        }
    }
}
