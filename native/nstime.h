/*
 * nstime.h - nanosecond times as Python gives them (st_mtime_ns, os.utime(ns=...)) and
 * as the kernel takes them (struct timespec), in one place for every binding.
 *
 * Plain C, no Python.
 */
#ifndef SPRITE_NSTIME_H
#define SPRITE_NSTIME_H

#include <stdint.h>
#include <time.h>

/* A timespec as nanoseconds since the epoch (what os.stat_result's *_ns fields hold). */
static inline int64_t nstime_of(struct timespec ts)
{
    return (int64_t)ts.tv_sec * 1000000000 + (int64_t)ts.tv_nsec;
}

/* Nanoseconds since the epoch as a timespec, seconds rounded down (a time before 1970 has
 * a negative second and a positive nanosecond part), as os.utime(ns=...) splits it. */
static inline struct timespec nstime_split(int64_t ns)
{
    int64_t sec = ns / 1000000000, rem = ns % 1000000000;
    if (rem < 0) {
        sec -= 1;
        rem += 1000000000;
    }
    return (struct timespec){.tv_sec = (time_t)sec, .tv_nsec = (long)rem};
}

#endif
