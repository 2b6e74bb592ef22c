/* TEST STAND-IN, not the emulated runtime: tests/emu/include/ft_emu.h's calls and
 * cudaMalloc / cudaFree / cudaMemcpy, just enough to build and test the NCCL emulation
 * (tests/emu/runtime/nccl_emu.cc, make test-nccl-emu) before the emulated runtime
 * exists. Device memory is malloc'ed blocks this file tracks, filled with the poison
 * (all bytes 0xFF: bf16 0xFFFF, fp32 0xFFFFFFFF, fp64 all ones) when allocated; one
 * device. The real runtime replaces this file (and standin/cuda_runtime_api.h) in the
 * emulated build; the test program runs unchanged against either. */
#include "ft_emu.h"

#include <cuda_runtime_api.h>

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct block {
    char *base;
    size_t size;
    int live; /* 0: freed (kept to say so) */
} block;

static block *blocks;
static size_t nblocks, cap;

void ft_emu_abort(const char *call, const char *fmt, ...)
{
    va_list ap;
    fflush(stdout);
    fprintf(stderr, "ft-emu: %s: ", call);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    fflush(stderr);
    _exit(134); /* no atexit handlers, no MPI_Finalize: mpirun takes the other ranks down */
}

/* The block holding p (live or freed), or NULL. */
static block *find(const void *p)
{
    uintptr_t x = (uintptr_t)p;
    for (size_t i = nblocks; i-- > 0;)
        if (x >= (uintptr_t)blocks[i].base && x < (uintptr_t)blocks[i].base + blocks[i].size)
            return &blocks[i];
    return NULL;
}

int ft_emu_is_device(const void *p, size_t bytes)
{
    block *b = find(p);
    return b && b->live && (uintptr_t)p + bytes <= (uintptr_t)b->base + b->size;
}

void ft_emu_check_device(const void *p, size_t bytes, const char *call, const char *what)
{
    if (ft_emu_is_device(p, bytes))
        return;
    block *b = find(p);
    if (!b)
        ft_emu_abort(call, "%s %p (%zu bytes) is not device memory (a host pointer?)", what, p,
                     bytes);
    if (!b->live)
        ft_emu_abort(call, "%s %p (%zu bytes) lies in a %zu-byte allocation at %p that was freed",
                     what, p, bytes, b->size, (void *)b->base);
    ft_emu_abort(call,
                 "%s %p (%zu bytes) runs %zu bytes past the end of its %zu-byte allocation at %p",
                 what, p, bytes, (size_t)((uintptr_t)p + bytes - (uintptr_t)b->base - b->size),
                 b->size, (void *)b->base);
}

void ft_emu_check_written(const void *p, size_t bytes, int elem_size, const char *call,
                          const char *what)
{
    const unsigned char *c = p;
    size_t es = (size_t)elem_size;
    for (size_t i = 0; i + es <= bytes; i += es) {
        size_t k = 0;
        while (k < es && c[i + k] == 0xFF)
            k++;
        if (k == es)
            ft_emu_abort(call,
                         "%s %p: element %zu (of %zu, %d bytes each) was never written (it holds "
                         "the poison of fresh device memory)",
                         what, p, i / es, bytes / es, elem_size);
    }
}

int ft_emu_device_count(void) { return 1; }
int ft_emu_current_device(void) { return 0; }

cudaError_t cudaMalloc(void **devPtr, size_t size)
{
    if (!devPtr)
        return cudaErrorInvalidValue;
    char *p = malloc(size ? size : 1);
    if (!p)
        return cudaErrorMemoryAllocation;
    memset(p, 0xFF, size ? size : 1);
    /* a freed block at this address is forgotten */
    for (size_t i = 0; i < nblocks; i++)
        if (!blocks[i].live && (uintptr_t)p + (size ? size : 1) > (uintptr_t)blocks[i].base &&
            (uintptr_t)p < (uintptr_t)blocks[i].base + blocks[i].size)
            blocks[i--] = blocks[--nblocks];
    if (nblocks == cap) {
        size_t ncap = cap ? 2 * cap : 64;
        block *nb = realloc(blocks, ncap * sizeof *nb);
        if (!nb) {
            free(p);
            return cudaErrorMemoryAllocation;
        }
        blocks = nb;
        cap = ncap;
    }
    blocks[nblocks++] = (block){p, size ? size : 1, 1};
    *devPtr = p;
    return cudaSuccess;
}

cudaError_t cudaFree(void *devPtr)
{
    if (!devPtr)
        return cudaSuccess;
    block *b = find(devPtr);
    if (!b || !b->live || b->base != (char *)devPtr)
        return cudaErrorInvalidValue;
    free(b->base);
    b->live = 0;
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind)
{
    if (!count)
        return cudaSuccess;
    int to_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    int from_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    if (kind == cudaMemcpyDefault) {
        to_dev = ft_emu_is_device(dst, count);
        from_dev = ft_emu_is_device(src, count);
    }
    if (to_dev)
        ft_emu_check_device(dst, count, "cudaMemcpy", "dst");
    if (from_dev)
        ft_emu_check_device(src, count, "cudaMemcpy", "src");
    memmove(dst, src, count);
    return cudaSuccess;
}
