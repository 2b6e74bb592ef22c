/* The emulated device's configuration (FT_EMU_DEVICES, FT_EMU_ARCH, FT_EMU_MEM and
 * CUDA_VISIBLE_DEVICES), the stop message every check ends in (ft_emu_abort), code
 * addresses as names for those messages, and the SIGSEGV handler that turns a fault in a
 * guard page or in freed device memory into such a message. No CUDA API symbol here (see
 * emu_internal.h). */
#include <ctype.h>
#include <cxxabi.h>
#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <execinfo.h>
#include <fcntl.h>
#include <link.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <string>
#include <vector>

#include "emu_internal.h"

namespace ft_emu {

/* ---- configuration ----------------------------------------------------------------------- */

/* The architectures FT_EMU_ARCH names; sharedMemPerBlockOptin as the hardware's. */
static const arch arches[] = {
    {"sm_80", "NVIDIA A100-SXM4-80GB", 8, 0, 108, 166912, 167936, 40 << 20},
    {"sm_86", "NVIDIA RTX A6000", 8, 6, 84, 101376, 102400, 6 << 20},
    {"sm_89", "NVIDIA GeForce RTX 4090", 8, 9, 128, 101376, 102400, 72 << 20},
    {"sm_90", "NVIDIA H100 80GB HBM3", 9, 0, 132, 232448, 233472, 50 << 20},
};

[[noreturn]] static void bad_env(const char *var, const char *value, const char *want)
{
    fprintf(stderr, "ft-emu: %s='%s': %s\n", var, value, want);
    exit(2);
}

/* "512MiB", "4GiB", "3G", "1000000": bytes (K, M, G, T and KiB.. binary, KB.. decimal). */
static size_t parse_bytes(const char *var, const char *s)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno || v <= 0)
        bad_env(var, s, "want a size such as 512MiB or 4GiB");
    std::string u(end);
    double scale = 1;
    static const char *const units = "KMGT";
    if (!u.empty() && u != "B") {
        const char *at = strchr(units, toupper((unsigned char)u[0]));
        if (!at)
            bad_env(var, s, "want a size such as 512MiB or 4GiB");
        int p = (int)(at - units) + 1;
        std::string rest = u.substr(1);
        double base = rest == "B" ? 1000 : 1024;
        if (!rest.empty() && rest != "B" && rest != "iB" && rest != "ib")
            bad_env(var, s, "want a size such as 512MiB or 4GiB");
        for (int i = 0; i < p; i++)
            scale *= base;
    }
    return (size_t)(v * scale);
}

static config read_config()
{
    config c = {};
    const char *d = getenv("FT_EMU_DEVICES");
    c.devices = 1;
    if (d && *d) {
        char *end;
        long n = strtol(d, &end, 10);
        if (*end || n < 0 || n > max_devices)
            bad_env("FT_EMU_DEVICES", d, "want a number of devices from 0 to 16");
        c.devices = (int)n;
    }
    const char *a = getenv("FT_EMU_ARCH");
    c.a = &arches[3];
    if (a && *a) {
        c.a = NULL;
        for (const arch &x : arches)
            if (!strcmp(a, x.sm))
                c.a = &x;
        if (!c.a)
            bad_env("FT_EMU_ARCH", a, "want sm_80, sm_86, sm_89 or sm_90");
    }
    const char *m = getenv("FT_EMU_MEM");
    c.mem = (size_t)4 << 30;
    if (m && *m)
        c.mem = parse_bytes("FT_EMU_MEM", m);
    /* CUDA_VISIBLE_DEVICES: ordinals in order, up to the first that is no device (as the
     * driver reads it); set but empty hides every device. */
    const char *v = getenv("CUDA_VISIBLE_DEVICES");
    if (!v) {
        for (int i = 0; i < c.devices; i++)
            c.visible[c.nvisible++] = i;
    } else {
        std::string s(v);
        size_t at = 0;
        while (at <= s.size() && c.nvisible < max_devices) {
            size_t comma = s.find(',', at);
            std::string tok = s.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
            char *end;
            long n = strtol(tok.c_str(), &end, 10);
            if (tok.empty() || *end || n < 0 || n >= c.devices)
                break;
            bool dup = false;
            for (int i = 0; i < c.nvisible; i++)
                dup |= c.visible[i] == n;
            if (dup)
                break;
            c.visible[c.nvisible++] = (int)n;
            if (comma == std::string::npos)
                break;
            at = comma + 1;
        }
    }
    return c;
}

const config &cfg()
{
    static const config c = read_config();
    return c;
}

/* ---- what is running ------------------------------------------------------------------- */

static thread_local const char *call_now;

const char *current_call() { return call_now; }
call_scope::call_scope(const char *call) : prev(call_now) { call_now = call; }
call_scope::~call_scope() { call_now = prev; }

[[noreturn]] void vabort(const char *call, const char *fmt, va_list ap)
{
    static std::atomic_flag once;
    if (once.test_and_set()) /* a second thread (or a fault in here): the first one speaks */
        for (;;)
            pause();
    fflush(stdout);
    char msg[2048];
    vsnprintf(msg, sizeof msg, fmt, ap);
    fprintf(stderr, "ft-emu: %s: %s\n", call ? call : "(emulated device)", msg);
    char where[512];
    if (describe_kernel(where, sizeof where))
        fprintf(stderr, "ft-emu:   while running %s\n", where);
    else if (call_now && (!call || strcmp(call, call_now)))
        fprintf(stderr, "ft-emu:   while running %s\n", call_now);
    void *frames[16];
    int n = capture(frames, 16, 2);
    char trace[2048];
    format_frames(frames, n, trace, sizeof trace);
    fprintf(stderr, "ft-emu:   called from %s\n", trace);
    fflush(stderr);
    signal(SIGABRT, SIG_DFL);
    abort();
}

} // namespace ft_emu

extern "C" void ft_emu_abort(const char *call, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ft_emu::vabort(call, fmt, ap);
}

extern "C" int ft_emu_device_count(void) { return ft_emu::cfg().nvisible; }

namespace ft_emu {

/* ---- symbols ------------------------------------------------------------------------------ */

namespace {
struct sym {
    uintptr_t addr, size;
    std::string name;
};
struct symtab {
    std::vector<sym> syms; /* the executable's functions, by address (load bias added) */
    uintptr_t lo = 0, hi = 0;
};

int exe_base(struct dl_phdr_info *info, size_t, void *data)
{
    *(uintptr_t *)data = info->dlpi_addr; /* the first object is the executable */
    return 1;
}

/* The executable's .symtab, read once (only on the way to a stop message). */
const symtab &exe_symbols()
{
    static symtab t;
    static std::once_flag once;
    std::call_once(once, [] {
        int fd = open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            return;
        struct stat st;
        void *map = MAP_FAILED;
        if (fstat(fd, &st) == 0 && st.st_size > (off_t)sizeof(Elf64_Ehdr))
            map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        close(fd);
        if (map == MAP_FAILED)
            return;
        const char *base = (const char *)map;
        const Elf64_Ehdr *eh = (const Elf64_Ehdr *)base;
        if (memcmp(eh->e_ident, ELFMAG, SELFMAG) || eh->e_ident[EI_CLASS] != ELFCLASS64 ||
            eh->e_shoff + (size_t)eh->e_shnum * sizeof(Elf64_Shdr) > (size_t)st.st_size) {
            munmap(map, (size_t)st.st_size);
            return;
        }
        uintptr_t bias = 0;
        dl_iterate_phdr(exe_base, &bias);
        const Elf64_Shdr *sh = (const Elf64_Shdr *)(base + eh->e_shoff);
        for (int i = 0; i < eh->e_shnum; i++) {
            if (sh[i].sh_type != SHT_SYMTAB || sh[i].sh_link >= eh->e_shnum)
                continue;
            const Elf64_Sym *s = (const Elf64_Sym *)(base + sh[i].sh_offset);
            const char *str = base + sh[sh[i].sh_link].sh_offset;
            size_t n = sh[i].sh_size / sizeof(Elf64_Sym);
            for (size_t j = 0; j < n; j++)
                if (ELF64_ST_TYPE(s[j].st_info) == STT_FUNC && s[j].st_value)
                    t.syms.push_back({s[j].st_value + bias, s[j].st_size, str + s[j].st_name});
        }
        std::sort(t.syms.begin(), t.syms.end(),
                  [](const sym &a, const sym &b) { return a.addr < b.addr; });
        if (!t.syms.empty()) {
            t.lo = t.syms.front().addr;
            t.hi = t.syms.back().addr + t.syms.back().size;
        }
        munmap(map, (size_t)st.st_size);
    });
    return t;
}

void demangle(const char *name, char *buf, size_t n)
{
    int status = 0;
    char *d = abi::__cxa_demangle(name, NULL, NULL, &status);
    snprintf(buf, n, "%s", d && status == 0 ? d : name);
    free(d);
}
} // namespace

void symbolize(const void *pc, char *buf, size_t n)
{
    uintptr_t a = (uintptr_t)pc;
    const symtab &t = exe_symbols();
    if (a >= t.lo && a < t.hi) {
        auto it = std::upper_bound(t.syms.begin(), t.syms.end(), a,
                                   [](uintptr_t x, const sym &s) { return x < s.addr; });
        if (it != t.syms.begin()) {
            --it;
            if (a < it->addr + (it->size ? it->size : 1)) {
                char name[512];
                demangle(it->name.c_str(), name, sizeof name);
                snprintf(buf, n, "%s", name);
                return;
            }
        }
    }
    Dl_info info;
    if (dladdr(pc, &info) && info.dli_sname) {
        char name[512];
        demangle(info.dli_sname, name, sizeof name);
        const char *file = info.dli_fname ? strrchr(info.dli_fname, '/') : NULL;
        snprintf(buf, n, "%s (%s)", name, file ? file + 1 : "?");
        return;
    }
    snprintf(buf, n, "%p", pc);
}

int capture(void **frames, int max, int skip)
{
    void *all[64];
    int n = backtrace(all, 64);
    int k = 0;
    for (int i = skip; i < n && k < max; i++)
        frames[k++] = all[i];
    return k;
}

void format_frames(void *const *frames, int n, char *buf, size_t len)
{
    size_t at = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && at + 1 < len; i++) {
        char name[256];
        /* a return address points after the call: look up the call itself */
        symbolize((const char *)frames[i] - 1, name, sizeof name);
        if (!strncmp(name, "ft_emu::", 8) || strstr(name, "__libc_start"))
            continue; /* the emulation's own frames and the C library's say nothing */
        if (!strcmp(name, "_start"))
            break;
        at += (size_t)snprintf(buf + at, len - at, "%s%s", at ? " < " : "", name);
        if (!strcmp(name, "main"))
            break;
    }
}

/* ---- faults ------------------------------------------------------------------------------ */

static void on_fault(int sig, siginfo_t *si, void *uc_)
{
    const void *addr = si->si_addr, *sp = NULL;
#if defined(__x86_64__)
    sp = (const void *)((ucontext_t *)uc_)->uc_mcontext.gregs[REG_RSP];
#endif
    char what[1024];
    bool known = describe_exec_address(addr, sp, what, sizeof what) ||
                 (describe_device_address && describe_device_address(addr, what, sizeof what));
    if (!known) { /* not ours: crash as the program would have */
        signal(sig, SIG_DFL);
        return;
    }
    const char *access = "access";
#if defined(__x86_64__)
    ucontext_t *uc = (ucontext_t *)uc_;
    access = uc->uc_mcontext.gregs[REG_ERR] & 2 ? "write" : "read";
#else
    (void)uc_;
#endif
    const char *k = running_kernel();
    char call[512];
    snprintf(call, sizeof call, "%s%s", k ? "kernel " : "", k ? k : current_call() ? current_call() : "host code");
    ft_emu_abort(call, "invalid %s of %p: %s", access, addr, what);
}

void ensure_altstack()
{
    static thread_local bool done;
    if (done)
        return;
    done = true;
    stack_t ss = {};
    size_t size = 1 << 16;
    ss.ss_sp = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (ss.ss_sp == MAP_FAILED)
        return;
    ss.ss_size = size;
    sigaltstack(&ss, NULL);
}

void install_fault_handler()
{
    static std::once_flag once;
    std::call_once(once, [] {
        void *warm[2];
        backtrace(warm, 2); /* loads libgcc now, not inside a signal handler */
        struct sigaction sa = {};
        sa.sa_sigaction = on_fault;
        sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGSEGV, &sa, NULL);
        sigaction(SIGBUS, &sa, NULL);
    });
    ensure_altstack();
}

} // namespace ft_emu
