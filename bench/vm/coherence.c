/* The guest side of bench/vm.sh's coherence check: how long a host edit of a file the
 * guest has just read (warm caches) takes to show in the guest.
 *
 *   vmbench-coherence CTL NAME FILE TRIALS TIMEOUT_MS
 *
 * CTL is the virtio-serial port to the host's helper (bench/vm.sh). For each trial: read
 * FILE twice (the second read is from warm caches), send "edit NAME I" to the host (which
 * rewrites FILE in place with "vI", padded to the same length, and answers "ok"), then
 * reread FILE every 250 us until it holds "vI", for at most TIMEOUT_MS. The time is taken
 * from the moment the request is sent, so it includes the request's trip to the host
 * (printed first as "ctl": the round trip of a "nop" request). Prints one line per trial:
 * "COH NAME I MS" or "COH NAME I never". Two trials in a row that never show end the
 * check. Built statically on the host (cc -static -O2). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define LEN 64

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static int read_file(const char *path, char *buf, size_t cap) {
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, cap - 1);
    close(fd);
    if (n < 0)
        return -1;
    buf[n] = 0;
    return (int)n;
}

/* Sends a line and waits for the host's one-line answer. */
static int ask(int ctl, const char *line, char *answer, size_t cap) {
    if (write(ctl, line, strlen(line)) != (ssize_t)strlen(line))
        return -1;
    size_t got = 0;
    while (got < cap - 1) {
        ssize_t n = read(ctl, answer + got, 1);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        if (answer[got] == '\n')
            break;
        got++;
    }
    answer[got] = 0;
    return 0;
}

/* The content the host writes for trial i (bench/vm.sh writes the same). */
static void expected(int i, char *out) {
    snprintf(out, LEN + 1, "v%d", i);
    size_t l = strlen(out);
    memset(out + l, '.', LEN - 1 - l);
    out[LEN - 1] = '\n';
    out[LEN] = 0;
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: %s CTL NAME FILE TRIALS TIMEOUT_MS\n", argv[0]);
        return 2;
    }
    const char *name = argv[2], *file = argv[3];
    int trials = atoi(argv[4]);
    double timeout = atof(argv[5]);
    int ctl = open(argv[1], O_RDWR);
    if (ctl < 0) {
        perror(argv[1]);
        return 1;
    }
    char answer[256], buf[4096], want[LEN + 1], line[256];
    /* The control channel's own round trip, for the reader of the results. */
    double best = 1e9;
    for (int i = 0; i < 5; i++) {
        double t0 = now_ms();
        if (ask(ctl, "nop\n", answer, sizeof answer) < 0) {
            fprintf(stderr, "control channel: no answer\n");
            return 1;
        }
        double d = now_ms() - t0;
        if (d < best)
            best = d;
    }
    printf("COHCTL %s %.2f\n", name, best);
    fflush(stdout);
    int never_in_a_row = 0;
    for (int i = 1; i <= trials; i++) {
        if (read_file(file, buf, sizeof buf) < 0 || read_file(file, buf, sizeof buf) < 0) {
            printf("COH %s %d error %s\n", name, i, strerror(errno));
            return 1;
        }
        expected(i, want);
        snprintf(line, sizeof line, "edit %s %d\n", name, i);
        struct timespec real0;
        clock_gettime(CLOCK_REALTIME, &real0);
        double t0 = now_ms(), seen = -1;
        if (write(ctl, line, strlen(line)) != (ssize_t)strlen(line)) {
            perror("control channel");
            return 1;
        }
        struct timespec pause = {0, 250000};
        for (;;) {
            int n = read_file(file, buf, sizeof buf);
            double t = now_ms();
            if (n == LEN && memcmp(buf, want, LEN) == 0) {
                seen = t - t0;
                break;
            }
            if (t - t0 > timeout)
                break;
            nanosleep(&pause, NULL);
        }
        /* The host's "ok" for the edit (it may have come while polling). */
        size_t got = 0;
        char c;
        while (read(ctl, &c, 1) == 1 && c != '\n' && got++ < 200)
            ;
        /* For matching with the host's and the client's logs (the clocks differ by an
         * offset: compare with ctl.py's log of the same trial). */
        printf("COHT %s %d %lld.%06ld %.3f\n", name, i, (long long)real0.tv_sec,
               real0.tv_nsec / 1000, seen);
        if (seen >= 0) {
            printf("COH %s %d %.2f\n", name, i, seen);
            never_in_a_row = 0;
        } else {
            printf("COH %s %d never\n", name, i);
            if (++never_in_a_row == 2) {
                fflush(stdout);
                break;
            }
        }
        fflush(stdout);
        usleep(20000);
    }
    return 0;
}
