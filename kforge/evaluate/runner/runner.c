/* kforge runner: the only process that ever loads a candidate kernel.
 *
 * It maps the tensors the judge gives it, sandboxes itself, dlopens the candidate, calls kf_launch,
 * times each call with its own clock, and answers over fixed-size binary frames on a SOCK_SEQPACKET
 * socket. It decides nothing: the judge (kforge/evaluate/_judge.py) reads the outputs itself and
 * cross-checks the times with its own clock. No Python, no torch.
 *
 * Built by kforge/evaluate/_runner.py: gcc for the CPU backend; nvcc -x cu -DKF_RUNNER_CUDA with
 * cudart linked statically for the CUDA backend (so this file is also valid C++); both with
 * kforge/kernels/include on the include path, for kforge.h.
 *
 * argv: chan_fd desc_fd in_fd out_fd times_fd so_path private_dir cpu_seconds mem_bytes
 *       [device in_handle_hex in_offset out_handle_hex out_offset]          (CUDA only)
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <dirent.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <linux/audit.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/landlock.h>
#include <linux/seccomp.h>
#ifdef KF_RUNNER_CUDA
#include <cuda_runtime.h>
#endif

/* the kernel ABI (kf_tensor, kf_launch_fn, kf_workspace_fn): the candidates' own header */
#include "kforge.h"

/* ---- frames: 64 bytes, little-endian, the same layout both ways (see _frames.py) */
#define KF_MAGIC 0x4E52464Bu /* "KFRN" */
enum { OP_READY = 1, OP_PING = 2, OP_FLOOR = 3, OP_LOAD = 4, OP_RUN = 5, OP_FAULT = 6, OP_QUIT = 7, OP_RECORD = 8 };
enum { ST_OK = 0, ST_LAUNCH = 1, ST_DEVICE = 2, ST_LOAD = 3, ST_NO_ENTRY = 4, ST_SETUP = 5, ST_BAD_REQUEST = 6 };

typedef struct kf_frame {
    uint32_t magic, seq, op;
    int32_t status;
    uint64_t a, b, c;
    double t, u;
    uint64_t pad;
} kf_frame;

/* ---- descriptor table written by the judge (mapped read-only) */
#define KF_DESC_MAGIC 0x4353454446464Bull /* "KFFDESC" */
typedef struct kf_desc_header {
    uint64_t magic, n_layouts, n_in, n_out, n_params, n_guards, in_bytes, out_bytes, page;
    uint64_t reserved[7];
} kf_desc_header;

/* sandbox facts, reported in the ready frame (names in _frames.py) */
enum {
    SB_ENV = 1 << 0, SB_SESSION = 1 << 1, SB_PRIVATE_DIR = 1 << 2, SB_RLIMITS = 1 << 3, SB_LOG = 1 << 4,
    SB_NO_NEW_PRIVS = 1 << 5, SB_NETNS = 1 << 6, SB_LANDLOCK_FS = 1 << 7, SB_LANDLOCK_NET = 1 << 8,
    SB_LANDLOCK_SCOPE = 1 << 9, SB_SECCOMP = 1 << 10, SB_RO_INPUTS = 1 << 11, SB_GUARD_PAGES = 1 << 12,
    SB_NO_CAPS = 1 << 13
};

static int chan = -1;
static volatile uint32_t cur_seq = 0;
static unsigned char* in_base = NULL;
static unsigned char* out_base = NULL;
static uint64_t in_bytes = 0, out_bytes = 0;

static int send_frame(uint32_t seq, uint32_t op, int32_t status, uint64_t a, uint64_t b, uint64_t c,
                      double t, double u) {
    kf_frame f;
    memset(&f, 0, sizeof f);
    f.magic = KF_MAGIC; f.seq = seq; f.op = op; f.status = status; f.a = a; f.b = b; f.c = c; f.t = t; f.u = u;
    return send(chan, &f, sizeof f, MSG_NOSIGNAL) == (ssize_t)sizeof f ? 0 : -1;
}

/* A fault is reported with where it hit (1: input arena, 2: output arena, 0: elsewhere), then the
 * process dies of the signal as it would have. */
static void on_fault(int sig, siginfo_t* info, void* ctx) {
    (void)ctx;
    uintptr_t addr = (uintptr_t)info->si_addr;
    uint64_t where = 0, off = 0;
    if (in_base && addr >= (uintptr_t)in_base && addr < (uintptr_t)in_base + in_bytes) {
        where = 1; off = addr - (uintptr_t)in_base;
    } else if (out_base && addr >= (uintptr_t)out_base && addr < (uintptr_t)out_base + out_bytes) {
        where = 2; off = addr - (uintptr_t)out_base;
    }
    send_frame(cur_seq, OP_FAULT, sig, where, off, (uint64_t)addr, 0, 0);
    signal(sig, SIG_DFL);
    raise(sig);
}

static void install_fault_handlers(void) {
    static char altstack[1 << 16];
    stack_t ss;
    memset(&ss, 0, sizeof ss);
    ss.ss_sp = altstack; ss.ss_size = sizeof altstack;
    sigaltstack(&ss, NULL);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_fault;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESETHAND;
    int sigs[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; ++i) sigaction(sigs[i], &sa, NULL);
}

#ifndef KF_RUNNER_CUDA
static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}
#endif

/* ---- sandbox steps */
static int env_allowed(const char* kv) {
    static const char* exact[] = {"PATH=", "LD_LIBRARY_PATH=", "HOME=", "TMPDIR=", "CUDA_VISIBLE_DEVICES=",
                                  "KFORGE_RUNNER_LIB_DIRS=", "KFORGE_RUNNER_RECORDER=", NULL};
    for (int i = 0; exact[i]; ++i) if (strncmp(kv, exact[i], strlen(exact[i])) == 0) return 1;
    return strncmp(kv, "CUDA_", 5) == 0 || strncmp(kv, "OMP_", 4) == 0 || strncmp(kv, "GOMP_", 5) == 0;
}

extern char** environ;
static int sandbox_env(void) {
    /* NB: the judge already sets the allow-list; this drops anything that slipped through. */
    int clean = 1;
    for (char** e = environ; *e;) {
        if (!env_allowed(*e)) {
            char name[256];
            const char* eq = strchr(*e, '=');
            size_t n = eq ? (size_t)(eq - *e) : strlen(*e);
            if (n >= sizeof name) n = sizeof name - 1;
            memcpy(name, *e, n); name[n] = 0;
            if (unsetenv(name) != 0) { clean = 0; ++e; }
        } else {
            ++e;
        }
    }
    return clean;
}

static int sandbox_rlimits(uint64_t cpu_s, uint64_t mem_bytes, int cuda) {
    int ok = 1;
    struct rlimit r;
    r.rlim_cur = r.rlim_max = 0;
    ok &= setrlimit(RLIMIT_CORE, &r) == 0;
    r.rlim_cur = r.rlim_max = 64ull << 20;
    ok &= setrlimit(RLIMIT_FSIZE, &r) == 0;
    r.rlim_cur = r.rlim_max = cuda ? 1024 : 64;
    ok &= setrlimit(RLIMIT_NOFILE, &r) == 0;
    if (cpu_s) {
        r.rlim_cur = cpu_s; r.rlim_max = cpu_s + 2;
        ok &= setrlimit(RLIMIT_CPU, &r) == 0;
    }
    if (mem_bytes) {
        /* NB: the CUDA driver reserves huge virtual ranges, so RLIMIT_AS would break it there;
         * RLIMIT_DATA (private writable memory) is limited instead, counted from what is in use now. */
        if (cuda) {
            uint64_t used = 0;
            FILE* f = fopen("/proc/self/status", "r");
            char line[256];
            while (f && fgets(line, sizeof line, f))
                if (strncmp(line, "VmData:", 7) == 0) used = strtoull(line + 7, NULL, 10) << 10;
            if (f) fclose(f);
            r.rlim_cur = r.rlim_max = used + mem_bytes;
            ok &= setrlimit(RLIMIT_DATA, &r) == 0;
        } else {
            r.rlim_cur = r.rlim_max = mem_bytes;
            ok &= setrlimit(RLIMIT_AS, &r) == 0;
        }
    }
    return ok;
}

#ifndef LANDLOCK_CREATE_RULESET_VERSION
#define LANDLOCK_CREATE_RULESET_VERSION (1U << 0)
#endif

static int ll_add(int ruleset, const char* path, uint64_t access, uint64_t handled) {
    int fd = open(path, O_PATH | O_CLOEXEC);
    if (fd < 0) return 0;
    struct stat st;
    if (fstat(fd, &st) == 0 && !S_ISDIR(st.st_mode)) {
        /* rules on a file may only carry file rights */
        uint64_t file_rights = LANDLOCK_ACCESS_FS_EXECUTE | LANDLOCK_ACCESS_FS_WRITE_FILE | LANDLOCK_ACCESS_FS_READ_FILE;
#ifdef LANDLOCK_ACCESS_FS_TRUNCATE
        file_rights |= LANDLOCK_ACCESS_FS_TRUNCATE;
#endif
#ifdef LANDLOCK_ACCESS_FS_IOCTL_DEV
        file_rights |= LANDLOCK_ACCESS_FS_IOCTL_DEV;
#endif
        access &= file_rights;
    }
    struct landlock_path_beneath_attr pb;
    memset(&pb, 0, sizeof pb);
    pb.allowed_access = access & handled;
    pb.parent_fd = fd;
    int rc = (int)syscall(SYS_landlock_add_rule, ruleset, LANDLOCK_RULE_PATH_BENEATH, &pb, 0);
    close(fd);
    return rc == 0;
}

/* ll_add for each folder of a colon-separated list (none when NULL). */
static void ll_add_list(int rs, const char* list, uint64_t access, uint64_t fs) {
    if (!list) return;
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", list);
    for (char* p = strtok(buf, ":"); p; p = strtok(NULL, ":")) if (*p) ll_add(rs, p, access, fs);
}

/* Returns the SB_LANDLOCK_* bits that hold. */
static int sandbox_landlock(const char* so_path, const char* private_dir, int cuda) {
    int abi = (int)syscall(SYS_landlock_create_ruleset, NULL, 0, LANDLOCK_CREATE_RULESET_VERSION);
    if (abi < 1) return 0;
    uint64_t fs = (1ull << 13) - 1; /* ABI 1: EXECUTE .. MAKE_SYM */
    if (abi >= 2) fs |= 1ull << 13;  /* REFER */
    if (abi >= 3) fs |= 1ull << 14;  /* TRUNCATE */
    if (abi >= 5) fs |= 1ull << 15;  /* IOCTL_DEV */
    struct { uint64_t fs, net, scoped; } attr;
    memset(&attr, 0, sizeof attr);
    attr.fs = fs;
    size_t attr_size = 8;
    int bits = SB_LANDLOCK_FS;
    if (abi >= 4) { attr.net = 3; attr_size = 16; bits |= SB_LANDLOCK_NET; }   /* BIND_TCP | CONNECT_TCP */
    if (abi >= 6) { attr.scoped = 3; attr_size = 24; bits |= SB_LANDLOCK_SCOPE; } /* abstract unix, signal */
    int rs = (int)syscall(SYS_landlock_create_ruleset, &attr, attr_size, 0);
    if (rs < 0) return 0;
    const uint64_t R = LANDLOCK_ACCESS_FS_READ_FILE | LANDLOCK_ACCESS_FS_READ_DIR;
    const uint64_t RX = R | LANDLOCK_ACCESS_FS_EXECUTE;
    const uint64_t RW_FILE = LANDLOCK_ACCESS_FS_READ_FILE | LANDLOCK_ACCESS_FS_WRITE_FILE | (1ull << 15);
    static const char* ro_dirs[] = {"/usr", "/lib", "/lib64", "/lib32", "/etc/ld.so.cache", "/etc/ld.so.conf",
                                    "/etc/ld.so.conf.d", "/proc/cpuinfo", "/proc/meminfo", "/proc/driver/nvidia",
                                    "/sys", "/dev/urandom", "/proc/stat", NULL};
    for (int i = 0; ro_dirs[i]; ++i) ll_add(rs, ro_dirs[i], RX, fs);
    if (cuda) {
        static const char* cuda_ro[] = {"/proc/devices", "/proc/modules", "/proc/sys/vm", "/etc/nvidia", NULL};
        for (int i = 0; cuda_ro[i]; ++i) ll_add(rs, cuda_ro[i], R, fs);
    }
    /* NB: /proc/self resolves to this process's own directory: other processes' /proc/<pid>
     * (their environ, their fds) stay unreadable. */
    ll_add(rs, "/proc/self", R, fs);
    ll_add_list(rs, getenv("LD_LIBRARY_PATH"), RX, fs);
    /* the folders of libraries a candidate may link (the judge names them: cuBLASLt's, where it is not under /usr) */
    ll_add_list(rs, getenv("KFORGE_RUNNER_LIB_DIRS"), RX, fs);
    ll_add(rs, so_path, LANDLOCK_ACCESS_FS_READ_FILE | LANDLOCK_ACCESS_FS_EXECUTE, fs);
    ll_add(rs, private_dir, fs, fs);
    ll_add(rs, "/dev/null", RW_FILE, fs);
    DIR* dev = opendir("/dev");
    if (dev) {
        struct dirent* e;
        while ((e = readdir(dev)) != NULL) {
            if (strncmp(e->d_name, "nvidia", 6) == 0) {
                char p[512];
                snprintf(p, sizeof p, "/dev/%s", e->d_name);
                ll_add(rs, p, RW_FILE | R, fs);
            }
        }
        closedir(dev);
    }
    int ok = syscall(SYS_landlock_restrict_self, rs, 0) == 0;
    close(rs);
    return ok ? bits : 0;
}

#define ALLOW BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW)
#define DENY(err) BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (err))
#define NR(n) BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (n), 0, 1), DENY(EPERM)
#define ARG_LO(i) (offsetof(struct seccomp_data, args) + 8 * (i))
#define ARG_HI(i) (offsetof(struct seccomp_data, args) + 8 * (i) + 4)
/* a call that names a process by its first argument: only 0 (the caller) or this process */
#define SELF_ONLY(n) BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (n), 0, 5), \
    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, ARG_LO(0)), \
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0, 2, 0), \
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, pid, 1, 0), \
    DENY(EPERM), ALLOW

/* No capabilities: a runner started as root could otherwise put the judge's threads on
   SCHED_DEADLINE or raise its own hard limits (found by review, 2026-12-02). Nothing of the runner
   needs one after its setup; no_new_privs keeps an exec from granting them back. */
static int sandbox_caps(void) {
    prctl(PR_SET_SECUREBITS, 0x2f /* NOROOT, NO_SETUID_FIXUP, KEEP_CAPS_LOCKED and their locks */, 0, 0, 0);
    for (int c = 0; c < 64; ++c) prctl(PR_CAPBSET_DROP, c, 0, 0, 0);
    prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
    struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct d[2];
    memset(d, 0, sizeof d);
    if (syscall(SYS_capset, &h, d) != 0) return 0;
    memset(d, 0xff, sizeof d);
    if (syscall(SYS_capget, &h, d) != 0) return 0;
    for (int i = 0; i < 2; ++i)
        if (d[i].effective || d[i].permitted || d[i].inheritable) return 0;
    return 1;
}

static int sandbox_seccomp(void) {
#if defined(__x86_64__)
    uint32_t pid = (uint32_t)getpid();
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, 0x40000000u, 0, 1), DENY(EPERM), /* x32 ABI */
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_clone3, 0, 1), DENY(ENOSYS), /* libc falls back to clone */
        NR(SYS_fork), NR(SYS_vfork), NR(SYS_execve), NR(SYS_execveat), NR(SYS_ptrace),
        NR(SYS_process_vm_readv), NR(SYS_process_vm_writev), NR(SYS_socket), NR(SYS_socketpair),
        NR(SYS_connect), NR(SYS_bind), NR(SYS_listen), NR(SYS_accept), NR(SYS_accept4),
        NR(SYS_io_uring_setup), NR(SYS_io_uring_enter), NR(SYS_io_uring_register), NR(SYS_bpf),
        NR(SYS_perf_event_open), NR(SYS_userfaultfd), NR(SYS_mount), NR(SYS_umount2), NR(SYS_unshare),
        NR(SYS_setns), NR(SYS_keyctl), NR(SYS_add_key), NR(SYS_request_key), NR(SYS_personality),
        NR(SYS_tkill), NR(SYS_rt_sigqueueinfo), NR(SYS_rt_tgsigqueueinfo), NR(SYS_pidfd_open),
        NR(SYS_pidfd_send_signal), NR(SYS_pidfd_getfd), NR(SYS_kcmp), NR(SYS_setsid), NR(SYS_setpgid),
        NR(SYS_chroot), NR(SYS_pivot_root), NR(SYS_init_module), NR(SYS_finit_module), NR(SYS_kexec_load),
        NR(SYS_reboot), NR(SYS_swapon), NR(SYS_acct), NR(SYS_settimeofday), NR(SYS_clock_settime),
        /* scheduling, priorities and limits act on any process by pid (the judge is getppid()): a
           candidate throttled the judge with SCHED_DEADLINE (eager read 100-5000x slow: FASTER at
           5610x), set the user's RLIMIT_CPU to 1 s (killed) and the judge's RLIMIT_NOFILE to 8 */
        NR(SYS_sched_setscheduler), NR(SYS_sched_setparam), NR(SYS_sched_setattr), NR(SYS_setpriority),
        NR(SYS_getpriority), NR(SYS_sched_getscheduler), NR(SYS_sched_getparam), NR(SYS_sched_getattr),
        NR(SYS_ioprio_set), NR(SYS_ioprio_get), NR(SYS_migrate_pages), NR(SYS_move_pages), NR(SYS_setrlimit),
#ifndef KF_RUNNER_CUDA
        /* a memory policy on the shared arenas moves the judge's pages too (review 4): eager reads the
           inputs from them. On CUDA the arenas are device memory and the driver may need it. */
        NR(SYS_mbind),
#endif
#ifdef SYS_process_madvise
        NR(SYS_process_madvise),
#endif
#ifdef SYS_process_mrelease
        NR(SYS_process_mrelease),
#endif
        SELF_ONLY(SYS_sched_setaffinity), SELF_ONLY(SYS_sched_getaffinity), SELF_ONLY(SYS_getpgid),
        SELF_ONLY(SYS_getsid),
        /* prlimit64: reading this process's own limits only (getrlimit); never setting any */
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_prlimit64, 0, 8),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, ARG_LO(0)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0, 0, 4),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, ARG_LO(2)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0, 0, 2),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, ARG_HI(2)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0, 1, 0),
        DENY(EPERM), ALLOW,
        /* clone: threads only */
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_clone, 0, 4),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, ARG_LO(0)),
        BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, CLONE_THREAD, 0, 1),
        ALLOW, DENY(EPERM),
        /* kill / tgkill: only this process, never SIGKILL (a death by SIGKILL is never the candidate's) */
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_kill, 0, 6),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, ARG_LO(0)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, pid, 1, 0), DENY(EPERM),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, ARG_LO(1)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SIGKILL, 0, 1), DENY(EPERM),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_tgkill, 0, 7),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, ARG_LO(0)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, pid, 1, 0), DENY(EPERM),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, ARG_LO(2)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SIGKILL, 0, 1), DENY(EPERM),
        ALLOW,
        ALLOW,
    };
    struct sock_fprog prog;
    prog.len = (unsigned short)(sizeof f / sizeof f[0]);
    prog.filter = f;
    return syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog) == 0;
#else
    return 0;
#endif
}

/* ---- the device side */
#ifdef KF_RUNNER_CUDA
/* the recorder (recorder.c), for a record job only: loaded RTLD_GLOBAL before the sandbox and the candidate, so
 * that the candidate's CUDA runtime imports bind to it; the record of each call goes to record.bin */
typedef void (*kf_rec_begin_fn)(void*);
typedef long (*kf_rec_end_fn)(const unsigned char**);
static kf_rec_begin_fn rec_begin = NULL;
static kf_rec_end_fn rec_end = NULL;
static int rec_fd = -1;
static uint64_t rec_written = 0;

static int load_recorder(const char* path) {
    void* lib = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
    if (!lib) { fprintf(stderr, "kforge runner: the recorder does not load: %s\n", dlerror()); return 0; }
    rec_begin = (kf_rec_begin_fn)dlsym(lib, "kf_recorder_begin");
    rec_end = (kf_rec_end_fn)dlsym(lib, "kf_recorder_end");
    rec_fd = open("record.bin", O_WRONLY | O_APPEND | O_NOFOLLOW | O_CLOEXEC);
    return rec_begin && rec_end && rec_fd >= 0;
}

static int write_all(int fd, const void* p, size_t n) {
    const unsigned char* c = (const unsigned char*)p;
    while (n) {
        ssize_t w = write(fd, c, n);
        if (w <= 0) return -1;
        c += w; n -= (size_t)w;
    }
    return 0;
}

__global__ void kf_empty_kernel(void) {}
static cudaStream_t stream;
static cudaEvent_t* ev_start;
static cudaEvent_t* ev_stop;

static int hex_handle(const char* hex, cudaIpcMemHandle_t* h) {
    if (strlen(hex) != 2 * sizeof(h->reserved)) return -1;
    for (size_t i = 0; i < sizeof(h->reserved); ++i) {
        unsigned v;
        if (sscanf(hex + 2 * i, "%2x", &v) != 1) return -1;
        h->reserved[i] = (char)v;
    }
    return 0;
}
#endif

static void* map_fd(int fd, uint64_t* size, int prot) {
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size <= 0) return NULL;
    *size = (uint64_t)st.st_size;
    void* p = mmap(NULL, *size, prot, MAP_SHARED, fd, 0);
    return p == MAP_FAILED ? NULL : p;
}

int main(int argc, char** argv) {
#ifdef KF_RUNNER_CUDA
    const int cuda = 1;
    if (argc != 15) { fprintf(stderr, "kforge runner: expected 14 arguments\n"); return 2; }
#else
    const int cuda = 0;
    if (argc != 10) { fprintf(stderr, "kforge runner: expected 9 arguments\n"); return 2; }
#endif
    chan = atoi(argv[1]);
    /* NB: if the judge dies, so does its runner (and nothing of the candidate outlives both). */
    prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
    int desc_fd = atoi(argv[2]), in_fd = atoi(argv[3]), out_fd = atoi(argv[4]), times_fd = atoi(argv[5]);
    const char* so_path = argv[6];
    const char* private_dir = argv[7];
    uint64_t cpu_s = strtoull(argv[8], NULL, 10), mem_bytes = strtoull(argv[9], NULL, 10);
    install_fault_handlers();
    int setup_error = 0;
    char why[256] = "";

    uint64_t desc_bytes = 0, times_bytes = 0;
    const unsigned char* desc = (const unsigned char*)map_fd(desc_fd, &desc_bytes, PROT_READ);
    double* times = (double*)map_fd(times_fd, &times_bytes, PROT_READ | PROT_WRITE);
    const kf_desc_header* hdr = (const kf_desc_header*)desc;
    uint64_t mask = 0;
    if (!desc || !times || desc_bytes < sizeof *hdr || hdr->magic != KF_DESC_MAGIC) {
        setup_error = 1; snprintf(why, sizeof why, "descriptor or times region unusable");
    }
    uint64_t n_layouts = 0, n_in = 0, n_out = 0, n_params = 0, n_guards = 0, page = 4096;
    if (!setup_error) {
        n_layouts = hdr->n_layouts; n_in = hdr->n_in; n_out = hdr->n_out; n_params = hdr->n_params;
        n_guards = hdr->n_guards; page = hdr->page;
        uint64_t need = sizeof *hdr + 8 * n_params + 8 * n_guards + n_layouts * (n_in + n_out) * sizeof(kf_tensor);
        if (need > desc_bytes || times_bytes < 8 * n_layouts || n_in + n_out > 4096) {
            setup_error = 1; snprintf(why, sizeof why, "descriptor table truncated");
        }
    }
    if (!setup_error && !cuda) {
        in_base = (unsigned char*)map_fd(in_fd, &in_bytes, PROT_READ);
        out_base = (unsigned char*)map_fd(out_fd, &out_bytes, PROT_READ | PROT_WRITE);
        if (!in_base || !out_base) { setup_error = 1; snprintf(why, sizeof why, "arenas do not map"); }
        else {
            /* NB: the input fd is read-only: write access cannot be gained by mprotect either; and the judge
             * sealed the memfd (F_SEAL_FUTURE_WRITE): the same file reopened writable through /proc/self/fd
             * cannot be mapped writable either (a candidate did that, issue 42). Both must hold. */
            int ro = mprotect(in_base, in_bytes, PROT_READ | PROT_WRITE) != 0;
            if (!ro) mprotect(in_base, in_bytes, PROT_READ);
            char self_fd[64];
            snprintf(self_fd, sizeof self_fd, "/proc/self/fd/%d", in_fd);
            int again = open(self_fd, O_RDWR | O_CLOEXEC);
            if (again >= 0) {
                void* w = mmap(NULL, in_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, again, 0);
                if (w != MAP_FAILED) { ro = 0; munmap(w, in_bytes); }
                close(again);
            }
            if (ro) mask |= SB_RO_INPUTS;
            const uint64_t* guards = (const uint64_t*)(desc + sizeof *hdr + 8 * n_params);
            int ok = 1;
            for (uint64_t g = 0; g < n_guards; ++g)
                ok &= guards[g] + page <= out_bytes && mprotect(out_base + guards[g], page, PROT_NONE) == 0;
            if (ok) mask |= SB_GUARD_PAGES;
        }
    }
#ifdef KF_RUNNER_CUDA
    if (!setup_error) {
        int device = atoi(argv[10]);
        cudaIpcMemHandle_t hin, hout;
        void *pin = NULL, *pout = NULL;
        cudaError_t err = cudaSetDevice(device);
        if (err == cudaSuccess && (hex_handle(argv[11], &hin) || hex_handle(argv[13], &hout))) err = cudaErrorInvalidValue;
        if (err == cudaSuccess) err = cudaIpcOpenMemHandle(&pin, hin, cudaIpcMemLazyEnablePeerAccess);
        if (err == cudaSuccess) err = cudaIpcOpenMemHandle(&pout, hout, cudaIpcMemLazyEnablePeerAccess);
        if (err == cudaSuccess) err = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
        if (err == cudaSuccess) {
            in_base = (unsigned char*)pin + strtoull(argv[12], NULL, 10);
            out_base = (unsigned char*)pout + strtoull(argv[14], NULL, 10);
            in_bytes = hdr->in_bytes; out_bytes = hdr->out_bytes;
            ev_start = (cudaEvent_t*)calloc(n_layouts + 1, sizeof(cudaEvent_t));
            ev_stop = (cudaEvent_t*)calloc(n_layouts + 1, sizeof(cudaEvent_t));
            for (uint64_t i = 0; i < n_layouts && err == cudaSuccess; ++i) {
                err = cudaEventCreate(&ev_start[i]);
                if (err == cudaSuccess) err = cudaEventCreate(&ev_stop[i]);
            }
            kf_empty_kernel<<<1, 1, 0, stream>>>();
            if (err == cudaSuccess) err = cudaStreamSynchronize(stream);
        }
        if (err != cudaSuccess) { setup_error = 1; snprintf(why, sizeof why, "CUDA setup: %s", cudaGetErrorString(err)); }
    }
#endif
    /* pointers of every layout, resolved once */
    kf_tensor* calls = NULL;
    const double* params = NULL;
    if (!setup_error) {
        params = (const double*)(desc + sizeof *hdr);
        const kf_tensor* recs = (const kf_tensor*)(desc + sizeof *hdr + 8 * n_params + 8 * n_guards);
        uint64_t per = n_in + n_out;
        calls = (kf_tensor*)malloc((n_layouts * per + 1) * sizeof(kf_tensor));
        for (uint64_t l = 0; l < n_layouts && !setup_error; ++l) {
            for (uint64_t j = 0; j < per; ++j) {
                kf_tensor t = recs[l * per + j];
                uint64_t off = (uint64_t)(uintptr_t)t.data;
                uint64_t limit = j < n_in ? in_bytes : out_bytes;
                if (off == UINT64_MAX) t.data = NULL;
                else if (off >= limit) { setup_error = 1; snprintf(why, sizeof why, "layout offset out of range"); }
                else t.data = (j < n_in ? in_base : out_base) + off;
                calls[l * per + j] = t;
            }
        }
    }

#ifdef KF_RUNNER_CUDA
    {
        const char* recorder = getenv("KFORGE_RUNNER_RECORDER");
        if (!setup_error && recorder && *recorder && (chdir(private_dir) != 0 || !load_recorder(recorder))) {
            setup_error = 1; snprintf(why, sizeof why, "the recorder could not be set up");
        }
    }
#endif
    /* ---- sandbox, in order, before anything of the candidate is loaded */
    /* NB: the kernel's OOM killer takes this process first, before the judge or the user's: raising it needs no
     * privilege, lowering it again does (and no capability is left after sandbox_caps). */
    int oom = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
    if (oom >= 0) { if (write(oom, "1000", 4) != 4) fprintf(stderr, "kforge runner: oom_score_adj not set\n"); close(oom); }
    if (sandbox_env()) mask |= SB_ENV;
    if (getsid(0) == getpid() || setsid() >= 0) mask |= SB_SESSION;
    if (chdir(private_dir) == 0) mask |= SB_PRIVATE_DIR;
    if (sandbox_rlimits(cpu_s, mem_bytes, cuda)) mask |= SB_RLIMITS;
    struct stat st_out, st_err;
    if (fstat(1, &st_out) == 0 && fstat(2, &st_err) == 0 && S_ISREG(st_out.st_mode) && S_ISREG(st_err.st_mode))
        mask |= SB_LOG;
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0) mask |= SB_NO_NEW_PRIVS;
    if (unshare(CLONE_NEWNET) == 0) mask |= SB_NETNS;
    mask |= (uint64_t)sandbox_landlock(so_path, private_dir, cuda);
    if (sandbox_caps()) mask |= SB_NO_CAPS;
    if (sandbox_seccomp()) mask |= SB_SECCOMP;
    if (setup_error) fprintf(stderr, "kforge runner: setup failed: %s\n", why);
    send_frame(0, OP_READY, setup_error ? ST_SETUP : ST_OK, (uint64_t)getpid(), 0, mask, 0, 0);
    if (setup_error) return 3;

    kf_launch_fn launch = NULL;
    void* workspace = NULL;
    uint64_t workspace_bytes = 0;
#ifdef KF_RUNNER_CUDA
    void* rec_workspace = NULL;
#endif
    kf_frame req;
    for (;;) {
        ssize_t n = recv(chan, &req, sizeof req, 0);
        if (n == 0) return 0;
        if (n != (ssize_t)sizeof req || req.magic != KF_MAGIC) return 4;
        cur_seq = req.seq;
        if (req.op == OP_QUIT) return 0;
        if (req.op == OP_PING) { send_frame(req.seq, OP_PING, ST_OK, req.a, 0, 0, 0, 0); continue; }
        if (req.op == OP_FLOOR) {
            /* the host cost of launching this runner's own empty kernel: the judge times it */
#ifdef KF_RUNNER_CUDA
            for (uint64_t i = 0; i < req.a; ++i) kf_empty_kernel<<<1, 1, 0, stream>>>();
            cudaDeviceSynchronize();
#endif
            send_frame(req.seq, OP_FLOOR, ST_OK, req.a, 0, 0, 0, 0);
            continue;
        }
        if (req.op == OP_LOAD) {
            void* lib = dlopen(so_path, RTLD_NOW | RTLD_LOCAL);
            if (!lib) {
                fprintf(stderr, "dlopen: %s\n", dlerror());
                send_frame(req.seq, OP_LOAD, ST_LOAD, 0, 0, 0, 0, 0);
                continue;
            }
            launch = (kf_launch_fn)dlsym(lib, "kf_launch");
            if (!launch) { send_frame(req.seq, OP_LOAD, ST_NO_ENTRY, 0, 0, 0, 0, 0); continue; }
            kf_workspace_fn ws = (kf_workspace_fn)dlsym(lib, "kf_workspace_bytes");
            uint64_t ws_bytes = ws ? (uint64_t)ws() : 0;
            workspace_bytes = ws_bytes;
            if (ws_bytes) {
#ifdef KF_RUNNER_CUDA
                if (cudaMalloc(&workspace, ws_bytes) != cudaSuccess) workspace = NULL;
#else
                workspace = aligned_alloc(4096, (ws_bytes + 4095) & ~4095ull);
#endif
                if (!workspace) { send_frame(req.seq, OP_LOAD, ST_LOAD, 0, 0, ws_bytes, 0, 0); continue; }
            }
            send_frame(req.seq, OP_LOAD, ST_OK, 0, 0, ws_bytes, 0, 0);
            continue;
        }
        if (req.op == OP_RUN) {
            uint64_t first = req.a, count = req.b;
            if (!launch || first > n_layouts || count > n_layouts - first) {
                send_frame(req.seq, OP_RUN, ST_BAD_REQUEST, 0, 0, 0, 0, 0);
                continue;
            }
            uint64_t per = n_in + n_out, done = 0;
            int code = 0;
            double sum = 0;
#ifdef KF_RUNNER_CUDA
            for (; done < count; ++done) {
                uint64_t l = first + done;
                const kf_tensor* c = calls + l * per;
                cudaEventRecord(ev_start[l], stream);
                code = launch(c, (int)n_in, c + n_in, (int)n_out, params, (int)n_params, workspace, (void*)stream);
                cudaEventRecord(ev_stop[l], stream);
                if (code) break;
            }
            /* NB: the whole device, not the stream: work moved elsewhere is waited for here, inside
             * the judge's wall clock. */
            cudaError_t err = cudaDeviceSynchronize();
            if (err == cudaSuccess) err = cudaGetLastError();
            if (err != cudaSuccess) { send_frame(req.seq, OP_RUN, ST_DEVICE, done, first + done, (uint64_t)err, 0, 0); return 5; }
            for (uint64_t i = 0; i < done; ++i) {
                float ms = 0;
                cudaEventElapsedTime(&ms, ev_start[first + i], ev_stop[first + i]);
                times[first + i] = ms * 1e3;
                sum += ms * 1e3;
            }
#else
            for (; done < count; ++done) {
                uint64_t l = first + done;
                const kf_tensor* c = calls + l * per;
                double t0 = now_us();
                code = launch(c, (int)n_in, c + n_in, (int)n_out, params, (int)n_params, workspace, NULL);
                double t1 = now_us();
                times[l] = t1 - t0;
                sum += t1 - t0;
                if (code) break;
            }
#endif
            send_frame(req.seq, OP_RUN, code ? ST_LAUNCH : ST_OK, done, first + done, (uint64_t)(int64_t)code, sum, 0);
            continue;
        }
#ifdef KF_RUNNER_CUDA
        if (req.op == OP_RECORD) {
            /* one call of layout a, recorded; b selects where the workspace lies (a second record at another
             * address). Appended to record.bin: [u64 bytes][u32 layout][i32 code][u32 cuda error][u32 n]
             * [u64 address of each input, output, workspace][u64 stream][the recorder's bytes] */
            uint64_t l = req.a;
            if (!launch || !rec_begin || l >= n_layouts) { send_frame(req.seq, OP_RECORD, ST_BAD_REQUEST, 0, 0, 0, 0, 0); continue; }
            if (workspace_bytes && !rec_workspace && cudaMalloc(&rec_workspace, workspace_bytes + 8192) != cudaSuccess) {
                send_frame(req.seq, OP_RECORD, ST_LOAD, 0, 0, workspace_bytes, 0, 0);
                continue;
            }
            void* w = workspace_bytes ? (void*)((unsigned char*)rec_workspace + 4096 * (req.b & 1)) : NULL;
            uint64_t per = n_in + n_out;
            const kf_tensor* c = calls + l * per;
            rec_begin((void*)stream);
            int code = launch(c, (int)n_in, c + n_in, (int)n_out, params, (int)n_params, w, (void*)stream);
            const unsigned char* data = NULL;
            long n = rec_end(&data);
            cudaError_t err = cudaDeviceSynchronize();
            if (err == cudaSuccess) err = cudaGetLastError();
            uint64_t head[3] = {0, 0, 0};
            uint32_t meta[4] = {(uint32_t)l, (uint32_t)code, (uint32_t)err, (uint32_t)(per + 1)};
            uint64_t ptrs[4096 + 2];
            for (uint64_t j = 0; j < per; ++j) ptrs[j] = (uint64_t)(uintptr_t)c[j].data;
            ptrs[per] = (uint64_t)(uintptr_t)w;
            ptrs[per + 1] = (uint64_t)(uintptr_t)stream;
            uint64_t body = sizeof meta + 8 * (per + 2) + (n > 0 ? (uint64_t)n : 0);
            head[0] = body;
            uint64_t at = rec_written;
            int ok = n >= 0 && write_all(rec_fd, head, 8) == 0 && write_all(rec_fd, meta, sizeof meta) == 0 &&
                     write_all(rec_fd, ptrs, 8 * (per + 2)) == 0 && (n == 0 || write_all(rec_fd, data, (size_t)n) == 0);
            if (ok) rec_written += 8 + body;
            send_frame(req.seq, OP_RECORD, ok ? (err == cudaSuccess ? ST_OK : ST_DEVICE) : ST_SETUP, at, ok ? 8 + body : 0,
                       (uint64_t)(int64_t)code, 0, 0);
            if (err != cudaSuccess) return 5;
            continue;
        }
#endif
        send_frame(req.seq, req.op, ST_BAD_REQUEST, 0, 0, 0, 0, 0);
    }
}
