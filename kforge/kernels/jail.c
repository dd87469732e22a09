/* The compiler's jail, compiled: what _jail.py does, without starting an interpreter for every compile (~20-30 ms of
 * CPU each on a loaded 2-core machine, the largest part of the build wall's cost). Built once into the kforge cache by
 * _compile.py (through _jail.py) and checked by its SHA-256 before every use.
 *
 *   jail CPU_S AS_BYTES FILE_BYTES NPROC N_READ N_DEVICES N_WRITE PATH... -- COMMAND...
 *
 * Sets RLIMIT_CORE 0, RLIMIT_CPU (soft CPU_S, hard CPU_S + 5), RLIMIT_FSIZE, RLIMIT_AS and, when NPROC > 0,
 * RLIMIT_NPROC; no_new_privs; where the kernel has Landlock, file access outside the N_READ folders (read and
 * execute), the N_DEVICES files (read and write) and the N_WRITE folders (everything), and TCP, are refused (with
 * ABI 6, signals and abstract sockets out of the jail too); then execs COMMAND, found on PATH. A failure to set up
 * prints the line _compile.py recognises and exits 127. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#define FAILED "kforge: the compiler's jail could not start it: "
enum { EXECUTE = 1, WRITE_FILE = 2, READ_FILE = 4, READ_DIR = 8, TRUNCATE = 1 << 14, IOCTL_DEV = 1 << 15 };

struct ruleset_attr { uint64_t fs, net, scoped; };
struct __attribute__((packed)) path_beneath { uint64_t allowed; int32_t fd; };

static void die(const char* what) {
    fprintf(stderr, FAILED "%s: %s\n", what, strerror(errno));
    _exit(127);
}

static void limit(int which, rlim_t value, rlim_t grace) {
    struct rlimit now;
    if (getrlimit(which, &now) != 0) die("getrlimit");
    rlim_t top = value + grace;
    if (now.rlim_max != RLIM_INFINITY) {
        if (top > now.rlim_max) top = now.rlim_max;
        if (value > now.rlim_max) value = now.rlim_max;
    }
    struct rlimit want = {value, top};
    if (setrlimit(which, &want) != 0) die("setrlimit");
}

static uint64_t handled;

static void allow(int ruleset, const char* path, uint64_t access) {
    int fd = open(path, O_PATH | O_CLOEXEC);
    if (fd < 0) return;   /* NB: a folder that is not there is not readable either */
    struct stat st;
    if (fstat(fd, &st) == 0 && !S_ISDIR(st.st_mode))
        access &= EXECUTE | WRITE_FILE | READ_FILE | (handled & (TRUNCATE | IOCTL_DEV));
    struct path_beneath rule = {access & handled, fd};
    syscall(SYS_landlock_add_rule, ruleset, 1, &rule, 0);
    close(fd);
}

static void landlock(char** read, int n_read, char** devices, int n_devices, char** write, int n_write) {
    long abi = syscall(SYS_landlock_create_ruleset, NULL, 0, 1);
    if (abi < 1) return;
    handled = (1 << 13) - 1;
    if (abi >= 2) handled |= 1 << 13;   /* REFER */
    if (abi >= 3) handled |= TRUNCATE;
    if (abi >= 5) handled |= IOCTL_DEV;
    struct ruleset_attr attr = {handled, abi >= 4 ? 3 : 0, abi >= 6 ? 3 : 0};
    size_t size = abi >= 6 ? 24 : abi >= 4 ? 16 : 8;
    int ruleset = (int)syscall(SYS_landlock_create_ruleset, &attr, size, 0);
    if (ruleset < 0) return;
    for (int i = 0; i < n_read; ++i) allow(ruleset, read[i], READ_FILE | READ_DIR | EXECUTE);
    for (int i = 0; i < n_devices; ++i) allow(ruleset, devices[i], READ_FILE | WRITE_FILE | TRUNCATE | IOCTL_DEV);
    for (int i = 0; i < n_write; ++i) allow(ruleset, write[i], handled);
    if (syscall(SYS_landlock_restrict_self, ruleset, 0) != 0) die("landlock_restrict_self");
    close(ruleset);
}

static const char* which(const char* program, char* buf, size_t size) {
    if (strchr(program, '/')) return program;
    const char* path = getenv("PATH");
    if (!path) path = "/bin:/usr/bin";
    while (*path) {
        const char* end = strchr(path, ':');
        size_t len = end ? (size_t)(end - path) : strlen(path);
        if (snprintf(buf, size, "%.*s/%s", (int)len, len ? path : ".", program) < (int)size &&
            access(buf, X_OK) == 0) {
            struct stat st;
            if (stat(buf, &st) == 0 && S_ISREG(st.st_mode)) return buf;
        }
        if (!end) break;
        path = end + 1;
    }
    errno = ENOENT;
    die(program);
    return NULL;
}

int main(int argc, char** argv) {
    if (argc < 10) { errno = EINVAL; die("usage: jail CPU_S AS FILE NPROC N_READ N_DEV N_WRITE PATH... -- CMD..."); }
    rlim_t cpu_s = strtoull(argv[1], NULL, 10), as = strtoull(argv[2], NULL, 10), fsize = strtoull(argv[3], NULL, 10);
    long long nproc = strtoll(argv[4], NULL, 10);
    int n_read = atoi(argv[5]), n_dev = atoi(argv[6]), n_write = atoi(argv[7]);
    int first = 8, dash = first + n_read + n_dev + n_write;
    if (n_read < 0 || n_dev < 0 || n_write < 0 || dash + 1 >= argc || strcmp(argv[dash], "--") != 0) {
        errno = EINVAL;
        die("malformed arguments");
    }
    limit(RLIMIT_CORE, 0, 0);
    /* NB: a soft limit below the hard one: the compiler gets SIGXCPU / SIGXFSZ (which say which limit) first */
    limit(RLIMIT_CPU, cpu_s, 5);
    limit(RLIMIT_FSIZE, fsize, 0);
    limit(RLIMIT_AS, as, 0);
    if (nproc > 0) limit(RLIMIT_NPROC, (rlim_t)nproc, 0);
    char buf[4096];
    const char* program = which(argv[dash + 1], buf, sizeof buf);
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) die("prctl");
    landlock(argv + first, n_read, argv + first + n_read, n_dev, argv + first + n_read + n_dev, n_write);
    execv(program, argv + dash + 1);
    die(program);
    return 127;
}
