/* What the parts of the emulated CUDA runtime (the .cc files of tests/emu/runtime) share. Not for the
 * code under test: that sees the fake toolkit headers of tests/emu/include only.
 *
 * The parts: context.cc (configuration, the stop message, symbols, the SIGSEGV handler),
 * exec.cc (the kernel engine: coroutines, barriers, shuffles), memory.cc (device memory
 * and its checks), device.cc (devices, errors, versions), stream.cc (streams, events),
 * launch.cc (kernel launches and their checks), queue.cc (the stream queues of
 * FT_EMU_ASYNC=1), cublas.cc. context.cc and exec.cc hold no
 * CUDA API symbol, so the host tests of the normal build (tests/emu/test_*_emu.cc) link
 * them beside the real CUDA runtime. */
#ifndef FT_EMU_INTERNAL_H
#define FT_EMU_INTERNAL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cuda_runtime_api.h"

namespace ft_emu {

/* ---- configuration (context.cc), read once from the environment ------------------------ */
struct arch {
    const char *sm;   /* "sm_90" */
    const char *name; /* the device name, "(emulated)" added */
    int major, minor, sms;
    size_t smem_optin, smem_per_sm;
    int l2;
};
struct config {
    int devices;          /* FT_EMU_DEVICES: the emulated machine's devices */
    const arch *a;        /* FT_EMU_ARCH */
    size_t mem;           /* FT_EMU_MEM: bytes of device memory per device */
    int visible[16];      /* ordinal -> emulated device, after CUDA_VISIBLE_DEVICES */
    int nvisible;
};
const config &cfg();
enum { max_devices = 16 };

/* ---- what is running, for the stop messages -------------------------------------------- */
/* The API call running on this host thread (set by call_scope), or NULL. */
const char *current_call();
struct call_scope {
    const char *prev;
    explicit call_scope(const char *call);
    ~call_scope();
};
/* "kernel K (file:line), block (x,y,z), thread (x,y,z)" when a kernel runs (exec.cc). */
bool describe_kernel(char *buf, size_t n);
/* The running kernel's name for messages, or NULL. */
const char *running_kernel();

/* ft_emu_abort with a va_list. */
[[noreturn]] void vabort(const char *call, const char *fmt, va_list ap);

/* "fn+0x1c (file)" for a code address: the dynamic symbols, else the executable's own
 * symbol table (static functions too). */
void symbolize(const void *pc, char *buf, size_t n);
/* The caller's call stack, skipping `skip` frames, into frames[max]; returns the count. */
int capture(void **frames, int max, int skip);
/* Frames as "a < b < c" (innermost first) into buf. */
void format_frames(void *const *frames, int n, char *buf, size_t len);

/* ---- faults ------------------------------------------------------------------------------ */
/* Installs the SIGSEGV/SIGBUS handler once (and an alternate signal stack for the calling
 * thread): a fault in a guard page, in freed device memory or past a kernel thread's
 * stack stops the run with what the address is; any other fault crashes as it would. */
void install_fault_handler();
void ensure_altstack();
/* Describes an address the emulation knows (buf), or returns false. exec.cc answers for
 * kernel stacks (sp: the faulting stack pointer, or NULL) and shared memory; memory.cc
 * (when linked: the emulated build) for device memory. */
bool describe_exec_address(const void *p, const void *sp, char *buf, size_t n);
bool describe_device_address(const void *p, char *buf, size_t n) __attribute__((weak));

/* ---- the device memory (memory.cc) ----------------------------------------------------- */
struct alloc;
/* The live allocation holding p (its [data, data + size] range, the end included), or
 * NULL; *freed set when p lies in freed memory still in quarantine. */
alloc *find_alloc(const void *p, bool *freed);
int alloc_device(const alloc *a);
/* Stops unless the slack bytes around the allocation still hold the pattern (an
 * out-of-bounds write found after the fact); `after` names what just ran. */
void check_guards(const alloc *a, const char *after);
void check_all_guards(const char *after);

/* ---- errors and devices (device.cc) ---------------------------------------------------- */
/* Records e as this thread's last error and returns it (cudaSuccess: nothing). */
cudaError_t fail(cudaError_t e);
/* The sticky error (a trapped kernel), or cudaSuccess. */
cudaError_t sticky();
void set_sticky(cudaError_t e);
/* The current device of this host thread, or -1 (cudaErrorNoDevice recorded) when the
 * process sees none. */
int current_device(cudaError_t *err);
/* current_device for a call that needs the device's context (memory, streams, events,
 * launches, cuBLAS): the first such call on a device opens the process's context there
 * (counted; FT_EMU_CONTEXT_LOG names a file that gets one line per context opened). */
int context_device(cudaError_t *err);
const cudaDeviceProp &props(int device);
bool peer_enabled(int device, int peer);

/* ---- streams (stream.cc) ----------------------------------------------------------------- */
/* cudaSuccess for a stream handle a call may take now (0, the legacy and per-thread
 * handles, or a live created one), else cudaErrorInvalidResourceHandle. */
cudaError_t check_stream(cudaStream_t s);

/* Where a stream's work queues: the stream (key: the created handle, cudaStreamLegacy for
 * 0 and the legacy handle, cudaStreamPerThread), its device (a created stream's own, else
 * the current one), and how it synchronizes with the others. */
struct lane {
    const void *key;
    int device;
    bool legacy;   /* the legacy default stream */
    bool blocking; /* synchronizes with the legacy default stream (not cudaStreamNonBlocking) */
};
/* For a stream check_stream accepted. */
lane lane_of(cudaStream_t s);

/* ---- the stream queues (queue.cc) ------------------------------------------------------ */
/* FT_EMU_ASYNC set (and not 0): stream work is queued until something forces it. */
bool deferred();
struct op;
typedef std::shared_ptr<op> op_ref;
/* Issues work on a lane: deferred, queues it after what CUDA's stream order puts before it
 * (and after `after`, when given: cudaStreamWaitEvent's event) and returns it; else runs
 * it now and returns NULL. `call` names it in the stop messages while it runs. idle_now:
 * runs it now (returns NULL) when nothing queued comes before it (an event record on an
 * idle stream completes at once; a copy never does, so that a missing wait shows). */
op_ref issue(const lane &l, const char *call, std::function<void()> run,
             const op_ref &after = nullptr, bool idle_now = false);
/* Whether o has run (NULL: yes). */
bool done(const op_ref &o);
/* Runs o, after what it transitively follows: the host waiting for it. */
void finish(const op_ref &o);
/* The last operation queued on a lane and not run yet, or NULL. */
op_ref lane_tail(const lane &l);
void finish_lane(const lane &l);
/* Runs everything queued on a device (-1: on every device). */
void finish_device(int device);
/* The operations queued and not run yet. */
size_t pending();
/* Whether the queued work runs because the process exits (a copy into host memory then
 * does nothing: its destination may be gone). */
bool at_exit();

} // namespace ft_emu

#endif
