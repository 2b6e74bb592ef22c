/* The clock of a timed span of device work (bench-train's timer).
 *
 * On the GPU the ops run asynchronously to the host: a call returns once its work is
 * enqueued, and the host waits only where it reads a value back. A clock read right after
 * the last op of a span would stop while the GPU still works on it (or, at the start,
 * count work issued before the span), so the clock is read once the device has finished
 * what was enqueued. */
#ifndef FT_DEVICE_CLOCK_H
#define FT_DEVICE_CLOCK_H

#include "ops.h"

/* Seconds of CLOCK_MONOTONIC, read after the work enqueued so far on `device` (the CUDA
 * backend's stream, for FT_DEV_CUDA) has finished; on the CPU the clock alone. */
double ft_device_clock(ft_device device);

#endif
