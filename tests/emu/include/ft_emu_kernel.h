/* The emulated CUDA device, device side (C++ only; cuda_runtime.h includes it): what a
 * kernel of kernels/cuda sees when it is compiled by the host compiler (make CUDA=emu, and
 * tests/emu/test_*_emu.cc), and the launch that FT_LAUNCH (kernels/cuda/cuda_common.cuh)
 * expands to.
 *
 * How a launch runs (tests/emu/runtime/exec.cc): whole blocks on the host threads of the
 * emulation (FT_EMU_THREADS); a block's threads as cooperative coroutines on one host
 * thread, so __syncthreads,
 * __syncwarp and the shuffles are real barriers and exchanges (a thread runs until it
 * waits at one, then the next thread runs), and a missing barrier shows as a thread
 * reading what another has not written yet. threadIdx, blockIdx, blockDim and gridDim
 * are the running thread's. Static __shared__ arrays are one per host thread (the block
 * running there); the dynamic shared memory (FT_DYNAMIC_SHARED) is a buffer of the
 * launch's size that ends at a guard page. What the emulation does not have: timing,
 * warp scheduling and lockstep, the memory model of real hardware, tensor-core fragment
 * layouts. */
#ifndef FT_EMU_KERNEL_H
#define FT_EMU_KERNEL_H

#ifndef __cplusplus
#error "ft_emu_kernel.h is C++"
#endif

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <tuple>
#include <type_traits>
#include <utility>

#include "cuda_runtime_api.h"

#ifndef FT_CUDA_EMU
#define FT_CUDA_EMU 1
#endif

/* ---- qualifiers ------------------------------------------------------------------------- */
/* Device code contracts a * b + c into one FMA where the compiler can, as nvcc does
 * (-fmad=true); host code in the same .cu file does not, as under nvcc's host compiler.
 * So the emulated build compiles kernels/cuda with -ffp-contract=off (and -mfma where the
 * CPU has FMA) and __global__ / __device__ functions turn contraction on for themselves
 * and what is inlined into them. (GCC fuses a product only when every use of it is an
 * add; NVPTX fuses more eagerly, so a few contractions of the GPU do not happen here.) */
#define FT_EMU_DEVICE_CODE __attribute__((optimize("fp-contract=fast")))
#define __global__ FT_EMU_DEVICE_CODE
#define __device__ FT_EMU_DEVICE_CODE
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
/* one array per host thread: the block that runs there */
#define __shared__ static thread_local
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(...)

struct uint3 {
    unsigned x, y, z;
};
struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
    constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
};

/* The running thread's coordinates (set by the engine before it runs a thread). */
extern __thread uint3 threadIdx, blockIdx;
extern __thread dim3 blockDim, gridDim;
constexpr int warpSize = 32;

namespace ft_emu {

/* ---- the engine (exec.cc) ---------------------------------------------------------------- */
/* One launch as the engine runs it: body(arg) once per thread of every block (the blocks
 * shared out between host threads, body called from any of them). name is what messages
 * call the kernel. smem: the dynamic shared memory, in bytes. run_grid returns false when
 * a thread called __trap (the blocks not started then do not run). */
struct grid_run {
    dim3 grid, block;
    size_t smem;
    const char *name;
    void (*body)(void *arg);
    void *arg;
};
bool run_grid(const grid_run &run);

/* The device-side primitives. syncthreads takes the call's place in the source: threads
 * of a block that wait at different __syncthreads are a divergent barrier, which stops the
 * run. */
void syncthreads(const char *file, int line);
void syncwarp(unsigned mask);
uint64_t shuffle(unsigned mask, uint64_t bits, int src_lane);
uint64_t shuffle_xor(unsigned mask, uint64_t bits, int lane_mask, int width);
unsigned lane_id();
void *dynamic_shared(size_t *bytes);
[[noreturn]] void trap();
/* A load through ld() found the never-written pattern: stops with where it points. */
[[noreturn]] __attribute__((cold)) void unwritten_load(const void *p, int bytes);

template <class T> uint64_t to_bits(T v)
{
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>, "shuffle of a big type");
    uint64_t u = 0;
    memcpy(&u, &v, sizeof v);
    return u;
}
template <class T> T from_bits(uint64_t u)
{
    T v;
    memcpy(&v, &u, sizeof v);
    return v;
}

/* ---- checking a launch's arguments ------------------------------------------------------ */
/* Every pointer a kernel is handed (an argument, or a field of a struct argument, at any
 * depth) must point into a live device allocation of the launch's device (or be NULL):
 * check_pointer stops the run otherwise (launch.cc). Structs are taken apart by their
 * fields (C++20 aggregates: counted by brace initialisation, read by structured
 * bindings), so a new argument struct is checked without being described anywhere; a
 * non-aggregate class argument does not compile. */
struct launch;
void check_pointer(launch &l, int arg, const char *path, const char *type, const void *p);

namespace refl {
struct any {
    template <class T> constexpr operator T() const noexcept;
};
template <size_t> using any_at = any;
template <class T, size_t... I> constexpr bool inits(std::index_sequence<I...>)
{
    return requires { T{any_at<I>{}...}; };
}
template <class T, size_t N = 0> constexpr size_t fields()
{
    if constexpr (N > 20)
        return N;
    else if constexpr (inits<T>(std::make_index_sequence<N + 1>{}))
        return fields<T, N + 1>();
    else
        return N;
}
/* the name of T, for messages */
template <class T> const char *type_name()
{
    static char name[128];
    if (!name[0]) {
        const char *f = __PRETTY_FUNCTION__, *s = strstr(f, "T = ");
        s = s ? s + 4 : f;
        size_t n = strcspn(s, ";]");
        if (n >= sizeof name)
            n = sizeof name - 1;
        memcpy(name, s, n);
    }
    return name;
}
} // namespace refl

template <class T> void visit(launch &l, int arg, char *path, size_t len, const T &x);

/* path: "att_args field 3", deeper fields ".1" after it */
#define FT_EMU_F(i)                                                                         \
    snprintf(path + len, 64 - len, nested ? ".%d" : " field %d", i),                        \
        visit(l, arg, path, strlen(path), a##i)
template <class T> void visit_fields(launch &l, int arg, char *path, size_t len, const T &x)
{
    const bool nested = strstr(path, " field ") != nullptr; /* path is [0, len) here */
    (void)nested;
    constexpr size_t n = refl::fields<T>();
    if constexpr (n == 0) {
    } else if constexpr (n == 1) {
        const auto &[a0] = x;
        FT_EMU_F(0);
    } else if constexpr (n == 2) {
        const auto &[a0, a1] = x;
        FT_EMU_F(0), FT_EMU_F(1);
    } else if constexpr (n == 3) {
        const auto &[a0, a1, a2] = x;
        FT_EMU_F(0), FT_EMU_F(1), FT_EMU_F(2);
    } else if constexpr (n == 4) {
        const auto &[a0, a1, a2, a3] = x;
        FT_EMU_F(0), FT_EMU_F(1), FT_EMU_F(2), FT_EMU_F(3);
    } else if constexpr (n == 5) {
        const auto &[a0, a1, a2, a3, a4] = x;
        FT_EMU_F(0), FT_EMU_F(1), FT_EMU_F(2), FT_EMU_F(3), FT_EMU_F(4);
    } else if constexpr (n == 6) {
        const auto &[a0, a1, a2, a3, a4, a5] = x;
        FT_EMU_F(0), FT_EMU_F(1), FT_EMU_F(2), FT_EMU_F(3), FT_EMU_F(4), FT_EMU_F(5);
    } else if constexpr (n <= 12) {
        if constexpr (n == 7) {
            const auto &[a0, a1, a2, a3, a4, a5, a6] = x;
            FT_EMU_F(0), FT_EMU_F(1), FT_EMU_F(2), FT_EMU_F(3), FT_EMU_F(4), FT_EMU_F(5),
                FT_EMU_F(6);
        } else if constexpr (n == 8) {
            const auto &[a0, a1, a2, a3, a4, a5, a6, a7] = x;
            FT_EMU_F(0), FT_EMU_F(1), FT_EMU_F(2), FT_EMU_F(3), FT_EMU_F(4), FT_EMU_F(5),
                FT_EMU_F(6), FT_EMU_F(7);
        } else if constexpr (n == 9) {
            const auto &[a0, a1, a2, a3, a4, a5, a6, a7, a8] = x;
            FT_EMU_F(0), FT_EMU_F(1), FT_EMU_F(2), FT_EMU_F(3), FT_EMU_F(4), FT_EMU_F(5),
                FT_EMU_F(6), FT_EMU_F(7), FT_EMU_F(8);
        } else if constexpr (n == 10) {
            const auto &[a0, a1, a2, a3, a4, a5, a6, a7, a8, a9] = x;
            FT_EMU_F(0), FT_EMU_F(1), FT_EMU_F(2), FT_EMU_F(3), FT_EMU_F(4), FT_EMU_F(5),
                FT_EMU_F(6), FT_EMU_F(7), FT_EMU_F(8), FT_EMU_F(9);
        } else if constexpr (n == 11) {
            const auto &[a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10] = x;
            FT_EMU_F(0), FT_EMU_F(1), FT_EMU_F(2), FT_EMU_F(3), FT_EMU_F(4), FT_EMU_F(5),
                FT_EMU_F(6), FT_EMU_F(7), FT_EMU_F(8), FT_EMU_F(9), FT_EMU_F(10);
        } else {
            const auto &[a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11] = x;
            FT_EMU_F(0), FT_EMU_F(1), FT_EMU_F(2), FT_EMU_F(3), FT_EMU_F(4), FT_EMU_F(5),
                FT_EMU_F(6), FT_EMU_F(7), FT_EMU_F(8), FT_EMU_F(9), FT_EMU_F(10), FT_EMU_F(11);
        }
    } else if constexpr (n <= 18) {
        if constexpr (n == 13) {
            const auto &[a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12] = x;
            FT_EMU_F(0), FT_EMU_F(1), FT_EMU_F(2), FT_EMU_F(3), FT_EMU_F(4), FT_EMU_F(5),
                FT_EMU_F(6), FT_EMU_F(7), FT_EMU_F(8), FT_EMU_F(9), FT_EMU_F(10), FT_EMU_F(11),
                FT_EMU_F(12);
        } else if constexpr (n == 14) {
            const auto &[a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13] = x;
            FT_EMU_F(0), FT_EMU_F(1), FT_EMU_F(2), FT_EMU_F(3), FT_EMU_F(4), FT_EMU_F(5),
                FT_EMU_F(6), FT_EMU_F(7), FT_EMU_F(8), FT_EMU_F(9), FT_EMU_F(10), FT_EMU_F(11),
                FT_EMU_F(12), FT_EMU_F(13);
        } else if constexpr (n == 15) {
            const auto &[a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14] = x;
            FT_EMU_F(0), FT_EMU_F(1), FT_EMU_F(2), FT_EMU_F(3), FT_EMU_F(4), FT_EMU_F(5),
                FT_EMU_F(6), FT_EMU_F(7), FT_EMU_F(8), FT_EMU_F(9), FT_EMU_F(10), FT_EMU_F(11),
                FT_EMU_F(12), FT_EMU_F(13), FT_EMU_F(14);
        } else if constexpr (n == 16) {
            const auto &[a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14,
                         a15] = x;
            FT_EMU_F(0), FT_EMU_F(1), FT_EMU_F(2), FT_EMU_F(3), FT_EMU_F(4), FT_EMU_F(5),
                FT_EMU_F(6), FT_EMU_F(7), FT_EMU_F(8), FT_EMU_F(9), FT_EMU_F(10), FT_EMU_F(11),
                FT_EMU_F(12), FT_EMU_F(13), FT_EMU_F(14), FT_EMU_F(15);
        } else if constexpr (n == 17) {
            const auto &[a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14,
                         a15, a16] = x;
            FT_EMU_F(0), FT_EMU_F(1), FT_EMU_F(2), FT_EMU_F(3), FT_EMU_F(4), FT_EMU_F(5),
                FT_EMU_F(6), FT_EMU_F(7), FT_EMU_F(8), FT_EMU_F(9), FT_EMU_F(10), FT_EMU_F(11),
                FT_EMU_F(12), FT_EMU_F(13), FT_EMU_F(14), FT_EMU_F(15), FT_EMU_F(16);
        } else {
            const auto &[a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14,
                         a15, a16, a17] = x;
            FT_EMU_F(0), FT_EMU_F(1), FT_EMU_F(2), FT_EMU_F(3), FT_EMU_F(4), FT_EMU_F(5),
                FT_EMU_F(6), FT_EMU_F(7), FT_EMU_F(8), FT_EMU_F(9), FT_EMU_F(10), FT_EMU_F(11),
                FT_EMU_F(12), FT_EMU_F(13), FT_EMU_F(14), FT_EMU_F(15), FT_EMU_F(16),
                FT_EMU_F(17);
        }
    } else {
        if constexpr (n == 19) {
            const auto &[a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14,
                         a15, a16, a17, a18] = x;
            FT_EMU_F(0), FT_EMU_F(1), FT_EMU_F(2), FT_EMU_F(3), FT_EMU_F(4), FT_EMU_F(5),
                FT_EMU_F(6), FT_EMU_F(7), FT_EMU_F(8), FT_EMU_F(9), FT_EMU_F(10), FT_EMU_F(11),
                FT_EMU_F(12), FT_EMU_F(13), FT_EMU_F(14), FT_EMU_F(15), FT_EMU_F(16),
                FT_EMU_F(17), FT_EMU_F(18);
        } else if constexpr (n == 20) {
            const auto &[a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14,
                         a15, a16, a17, a18, a19] = x;
            FT_EMU_F(0), FT_EMU_F(1), FT_EMU_F(2), FT_EMU_F(3), FT_EMU_F(4), FT_EMU_F(5),
                FT_EMU_F(6), FT_EMU_F(7), FT_EMU_F(8), FT_EMU_F(9), FT_EMU_F(10), FT_EMU_F(11),
                FT_EMU_F(12), FT_EMU_F(13), FT_EMU_F(14), FT_EMU_F(15), FT_EMU_F(16),
                FT_EMU_F(17), FT_EMU_F(18), FT_EMU_F(19);
        } else {
            static_assert(n <= 20, "a kernel argument struct of more than 20 fields: add a "
                                   "case to ft_emu::visit_fields");
        }
    }
}
#undef FT_EMU_F

template <class T> void visit(launch &l, int arg, char *path, size_t len, const T &x)
{
    using U = std::remove_cv_t<T>;
    if constexpr (std::is_pointer_v<U>) {
        if constexpr (!std::is_function_v<std::remove_pointer_t<U>>)
            check_pointer(l, arg, path, refl::type_name<U>(), (const void *)x);
    } else if constexpr (std::is_arithmetic_v<U> || std::is_enum_v<U>) {
    } else if constexpr (std::is_array_v<U>) {
        for (const auto &e : x)
            visit(l, arg, path, len, e);
    } else {
        static_assert(std::is_aggregate_v<U>,
                      "a kernel argument of class type must be an aggregate (its fields are "
                      "checked for host pointers)");
        visit_fields(l, arg, path, len, x);
    }
}

/* ---- the launch ------------------------------------------------------------------------- */
/* The runtime's side of a launch (launch.cc): begin validates the configuration and the
 * kernel's shared memory and returns false (the error recorded for cudaGetLastError)
 * when CUDA would refuse the launch; run issues the grid on the launch's stream (run now,
 * or queued with FT_EMU_ASYNC), then checks the guard bytes of every allocation an
 * argument pointed into; it owns arg from then on and hands it to drop when done. */
struct launch_site {
    const void *kernel;
    const char *text, *file;
    int line;
    dim3 grid, block;
    size_t smem;
    void *stream;
};
launch *launch_begin(const launch_site &site);
void launch_run(launch *l, void (*body)(void *), void *arg, void (*drop)(void *));
const char *launch_name(launch *l);

template <class T> T implicit(T v) { return v; }

/* Checks the pointers of argument i (1-based) of a launch. */
template <class T> void visit_arg(launch &l, int i, const T &x)
{
    char path[64];
    snprintf(path, sizeof path, "%s", refl::type_name<T>());
    visit(l, i, path, strlen(path), x);
}

template <class... P> struct launcher {
    void (*kernel)(P...);
    launch_site site;

    template <class... A> void operator()(A &&...a) const
    {
        static_assert(sizeof...(A) == sizeof...(P), "a kernel launched with the wrong number "
                                                    "of arguments");
        struct closure {
            void (*kernel)(P...);
            std::tuple<std::remove_cvref_t<P>...> args;
        };
        /* the arguments are taken now, as a launch takes them (the kernel may run later:
         * FT_EMU_ASYNC) */
        closure *c = new closure{kernel, {implicit<std::remove_cvref_t<P>>(std::forward<A>(a))...}};
        auto drop = [](void *p) { delete (closure *)p; };
        launch *l = launch_begin(site);
        if (!l) {
            drop(c);
            return;
        }
        std::apply([&](const auto &...x) { int i = 0; (visit_arg(*l, ++i, x), ...); }, c->args);
        launch_run(
            l,
            [](void *p) {
                closure *cl = (closure *)p;
                std::apply(cl->kernel, cl->args); /* by value: each thread its own copy */
            },
            c, drop);
    }
};

template <class... P>
launcher<P...> launch_of(void (*k)(P...), const char *text, const char *file, int line,
                         dim3 grid, dim3 block, size_t smem, cudaStream_t stream)
{
    return launcher<P...>{k, {(const void *)k, text, file, line, grid, block, smem,
                              (void *)stream}};
}

} // namespace ft_emu

/* kernels/cuda/cuda_common.cuh's FT_LAUNCH in the emulated build */
#define FT_EMU_LAUNCH(k, grid, block, smem, stream)                                         \
    ::ft_emu::launch_of((k), #k, __FILE__, __LINE__, (grid), (block), (smem), (stream))

/* ---- device functions ------------------------------------------------------------------- */
inline void __syncthreads(const char *file = __builtin_FILE(), int line = __builtin_LINE())
{
    ft_emu::syncthreads(file, line);
}
inline void __syncwarp(unsigned mask = 0xffffffffu) { ft_emu::syncwarp(mask); }
template <class T> T __shfl_sync(unsigned mask, T v, int src, int width = 32)
{
    int lane = (int)ft_emu::lane_id(), base = lane & ~(width - 1);
    return ft_emu::from_bits<T>(ft_emu::shuffle(mask, ft_emu::to_bits(v), base + (src & (width - 1))));
}
template <class T> T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32)
{
    return ft_emu::from_bits<T>(ft_emu::shuffle_xor(mask, ft_emu::to_bits(v), lane_mask, width));
}
template <class T> T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32)
{
    int lane = (int)ft_emu::lane_id(), src = lane + (int)delta;
    if ((src & ~(width - 1)) != (lane & ~(width - 1)))
        src = lane;
    return ft_emu::from_bits<T>(ft_emu::shuffle(mask, ft_emu::to_bits(v), src));
}
template <class T> T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32)
{
    int lane = (int)ft_emu::lane_id(), src = lane - (int)delta;
    if (src < (lane & ~(width - 1)))
        src = lane;
    return ft_emu::from_bits<T>(ft_emu::shuffle(mask, ft_emu::to_bits(v), src));
}
[[noreturn]] inline void __trap() { ft_emu::trap(); }
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

/* Arithmetic as CUDA's intrinsics round it. The _rn forms are never merged into an FMA
 * (the kernels use them where the CPU twin has no FMA): an empty asm hides the operands
 * (add, subtract) or the product from the compiler, which the emulated build lets
 * contract a * b + c elsewhere (-ffp-contract=fast), as nvcc does. */
#if defined(__x86_64__)
#define FT_EMU_OPAQUE(v) __asm__("" : "+x"(v))
#elif defined(__aarch64__)
#define FT_EMU_OPAQUE(v) __asm__("" : "+w"(v))
#else
#define FT_EMU_OPAQUE(v) __asm__("" : "+m"(v))
#endif
inline float __fmul_rn(float a, float b)
{
    float r = a * b;
    FT_EMU_OPAQUE(r);
    return r;
}
inline float __fadd_rn(float a, float b)
{
    FT_EMU_OPAQUE(a);
    FT_EMU_OPAQUE(b);
    return a + b;
}
inline float __fsub_rn(float a, float b)
{
    FT_EMU_OPAQUE(a);
    FT_EMU_OPAQUE(b);
    return a - b;
}
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline float __frcp_rn(float a) { return 1.0f / a; }
inline float __fsqrt_rn(float a) { return sqrtf(a); }
inline float rsqrtf(float a) { return 1.0f / sqrtf(a); }
/* the fast intrinsics: the accurate functions (the GPU's are within a few ulp of them) */
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __fdividef(float a, float b) { return a / b; }

inline int min(int a, int b) { return a < b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline unsigned long long min(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline unsigned long long max(unsigned long long a, unsigned long long b) { return a > b ? a : b; }

/* ld()'s check (kernels/cuda/kernel_common.cuh): a load of the pattern fresh device
 * memory holds, all ones, is a read of memory never written. */
inline void ft_emu_check_load(const void *p, int bytes)
{
    if (bytes == 2) {
        uint16_t v;
        memcpy(&v, p, 2);
        if (__builtin_expect(v == 0xffffu, 0))
            ft_emu::unwritten_load(p, 2);
    } else {
        uint32_t v;
        memcpy(&v, p, 4);
        if (__builtin_expect(v == 0xffffffffu, 0))
            ft_emu::unwritten_load(p, 4);
    }
}

#endif
