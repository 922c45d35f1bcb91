/*
 * Stand-in libnvidia-ml.so.1: serves NVML calls from a state file so gpuwatchd can be tested without a GPU.
 *
 * Compiled on demand by gpuwatchd/sim/build.py against NVIDIA's real nvml.h (pinned nvidia-nvml-dev wheel), so
 * every struct layout is NVIDIA's. The state file (path in $GPUWATCHD_SIM_STATE, read at nvmlInit) is written by
 * gpuwatchd/sim/state.py; its line format is documented there and in docs/sim-state.md.
 *
 * Design points:
 *  - Per-call cost is the floor the daemon's polling cost is compared against, so the hot path is: one mutex,
 *    one CLOCK_MONOTONIC read (a stat() of the state file at most every RELOAD_CHECK_NS), array lookups.
 *  - Every exported function is wrapped in #ifndef OMIT_<name> so a build can leave symbols out, which pynvml
 *    surfaces as NVMLError_FunctionNotFound (old-driver fallbacks).
 *  - The state is swapped under the mutex; all reads of it happen under the mutex, so the old one can be freed.
 *  - Delays sleep without the mutex; a delay of -1 (hung driver) sleeps in slices and ends only when the state
 *    stops asking for it, so the process stays killable and a scenario can "un-hang" the driver.
 */
#include "standin.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))
/* How often a call may stat() the state file: cheap enough for the hot path, fast enough for a 10 Hz player. */
#define RELOAD_CHECK_NS 2000000LL
/* Sleep slice for hung calls and event waits: short enough that a test's state change is seen promptly. */
#define SLICE_NS 2000000LL
#define EVSET_MAGIC 0x47575345u


struct nvmlEventSet_st {
    unsigned int magic;
    unsigned long long last_seq;
    unsigned long long mask[MAX_DEVICES];
    unsigned long long reg_seq[MAX_DEVICES]; /* events up to this seq predate registration: never delivered */
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int refcount;
static char state_path[4096];
static sstate *st;
static unsigned long long gen = 1;
static struct {
    dev_t dev;
    ino_t ino;
    long long size, mtime_ns, ctime_ns;
} sig;
static long long last_check_ns;
/* The last state file seen stays open: while we hold its inode, no replacement can reuse the inode number, so a
 * changed (st_dev, st_ino) reliably means "replaced" even when two replaces land within one timestamp tick. */
static int held_fd = -1;
static int enum_n;
static char enum_uuid[MAX_DEVICES][NVML_DEVICE_UUID_V2_BUFFER_SIZE];
static struct nvmlDevice_st handles[MAX_DEVICES];

/* ------------------------------------------------------------------------------------------------ state */

static long long mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void sleep_ns(long long ns) {
    struct timespec ts = {(time_t)(ns / 1000000000LL), (long)(ns % 1000000000LL)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static long long ts_ns(struct timespec t) { return (long long)t.tv_sec * 1000000000LL + t.tv_nsec; }

/* Called with mu held. Re-reads the state file when it was replaced; a bad file keeps the old state. */
static void maybe_reload(int force) {
    long long now = mono_ns();
    if (!force && now - last_check_ns < RELOAD_CHECK_NS) return;
    last_check_ns = now;
    struct stat sb;
    if (stat(state_path, &sb) != 0) return;
    if (!force && sig.dev == sb.st_dev && sig.ino == sb.st_ino && sig.size == (long long)sb.st_size &&
        sig.mtime_ns == ts_ns(sb.st_mtim) && sig.ctime_ns == ts_ns(sb.st_ctim))
        return;
    int fd = open(state_path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    if (fstat(fd, &sb) != 0) {
        close(fd);
        return;
    }
    if (held_fd >= 0) close(held_fd);
    held_fd = fd;
    sig.dev = sb.st_dev;
    sig.ino = sb.st_ino;
    sig.size = (long long)sb.st_size;
    sig.mtime_ns = ts_ns(sb.st_mtim);
    sig.ctime_ns = ts_ns(sb.st_ctim);
    sstate *n = parse_state(fd);
    if (!n) return;
    free_state(st);
    st = n;
    gen++;
}

static int find_dev(const char *uuid) {
    for (int i = 0; i < st->ndev; i++)
        if (strcmp(st->devs[i].uuid, uuid) == 0) return i;
    return -1;
}

/* With mu held (after enter_lib/enter_dev): the state's device with this UUID, or NULL. */
sdev *state_dev(const char *uuid) {
    int i = st ? find_dev(uuid) : -1;
    return i >= 0 ? &st->devs[i] : NULL;
}

/* With mu held: the state's device behind a handle, or NULL if its UUID left the state (surprise removal). */
static sdev *lookup(struct nvmlDevice_st *h) {
    if (h->gen != gen) {
        h->didx = find_dev(enum_uuid[h->slot]);
        h->gen = gen;
    }
    return h->didx >= 0 ? &st->devs[h->didx] : NULL;
}

sdev *gpu_at(int slot) {
    maybe_reload(0);
    return slot >= 0 && slot < enum_n ? lookup(&handles[slot]) : NULL;
}

nvmlDevice_t gpu_handle(int slot) { return &handles[slot]; }

int enum_count(void) { return enum_n; }

static int valid_handle(nvmlDevice_t h) {
    return h >= &handles[0] && h < &handles[enum_n];
}

int peer_slot(nvmlDevice_t h) { return valid_handle(h) ? h->slot : -1; }

static int delay_for(const sdev *d, int fid) {
    if (!d->has_overrides) return 0;
    return d->delay[fid] ? d->delay[fid] : d->delay_all;
}

static int err_for(const sdev *d, int fid, int wildcard) {
    if (!d->has_overrides) return 0;
    return d->err[fid] ? d->err[fid] : (wildcard ? d->err_all : 0);
}

/* Sleep for a per-call delay with mu released; returns with mu held again. -1 blocks until the state drops it. */
static void run_delay(int fid, int slot, int ms) {
    pthread_mutex_unlock(&mu);
    if (ms > 0) {
        sleep_ns((long long)ms * 1000000LL);
        pthread_mutex_lock(&mu);
        if (refcount) maybe_reload(0); /* the GPU may have been lost while the call was stuck */
        return;
    }
    for (;;) {
        sleep_ns(SLICE_NS);
        pthread_mutex_lock(&mu);
        if (!refcount || slot >= enum_n) return;
        maybe_reload(0);
        sdev *d = lookup(&handles[slot]);
        if (!d || delay_for(d, fid) != -1) return;
        pthread_mutex_unlock(&mu);
    }
}

/*
 * Common prologue of every per-device call: init check, argument check, state refresh, delay, lost, override.
 * On NVML_SUCCESS it returns with mu held and *out set; the caller must call leave().
 */
nvmlReturn_t enter_dev(int fid, nvmlDevice_t h, int args_ok, sdev **out) {
    pthread_mutex_lock(&mu);
    if (!refcount) goto uninit;
    if (is_mig_handle(h)) return enter_mig(fid, h, args_ok, out); /* standin_mig.c */
    if (!valid_handle(h) || !args_ok) {
        pthread_mutex_unlock(&mu);
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    maybe_reload(0);
    sdev *d = lookup(h);
    if (d) {
        int ms = delay_for(d, fid);
        if (ms) {
            run_delay(fid, h->slot, ms);
            if (!refcount) goto uninit;
            d = lookup(h);
        }
    }
    if (!d || d->lost) {
        pthread_mutex_unlock(&mu);
        return NVML_ERROR_GPU_IS_LOST;
    }
    int e = err_for(d, fid, 1);
    if (e) {
        pthread_mutex_unlock(&mu);
        return (nvmlReturn_t)e;
    }
    *out = d;
    return NVML_SUCCESS;
uninit:
    pthread_mutex_unlock(&mu);
    return NVML_ERROR_UNINITIALIZED;
}

nvmlReturn_t leave(nvmlReturn_t r) {
    pthread_mutex_unlock(&mu);
    return r;
}

nvmlReturn_t enter_lib(void) {
    pthread_mutex_lock(&mu);
    if (!refcount) return leave(NVML_ERROR_UNINITIALIZED);
    maybe_reload(0);
    return NVML_SUCCESS;
}

static nvmlReturn_t put_uint(long long v, unsigned int *out) {
    if (v == UNSET) return leave(NVML_ERROR_NOT_SUPPORTED);
    *out = (unsigned int)v;
    return leave(NVML_SUCCESS);
}

static nvmlReturn_t put_ull(long long v, unsigned long long *out) {
    if (v == UNSET) return leave(NVML_ERROR_NOT_SUPPORTED);
    *out = (unsigned long long)v;
    return leave(NVML_SUCCESS);
}

static nvmlReturn_t put_str(const char *s, char *buf, unsigned int len) {
    if (strlen(s) + 1 > len) return leave(NVML_ERROR_INSUFFICIENT_SIZE);
    memcpy(buf, s, strlen(s) + 1);
    return leave(NVML_SUCCESS);
}

/* A getter whose whole body is "return one scalar field". */
#define GET_UINT(fn, field)                                                      \
    EXPORT nvmlReturn_t fn(nvmlDevice_t device, unsigned int *out) {             \
        sdev *d;                                                                 \
        nvmlReturn_t r = enter_dev(F_##fn, device, out != NULL, &d);             \
        return r ? r : put_uint(d->field, out);                                  \
    }
#define GET_ULL(fn, field)                                                       \
    EXPORT nvmlReturn_t fn(nvmlDevice_t device, unsigned long long *out) {       \
        sdev *d;                                                                 \
        nvmlReturn_t r = enter_dev(F_##fn, device, out != NULL, &d);             \
        return r ? r : put_ull(d->field, out);                                   \
    }

/*
 * The simple readings (standin_readings.def), one getter per row. Each is left out when the build defines
 * OMIT_<symbol>, like the #ifndef OMIT_ blocks of the hand-written calls; as #ifndef cannot sit in a macro, the
 * choice is made by token pasting: -DOMIT_x defines OMIT_x as 1, and STANDIN_OMITTED_1 expands to a comma, which
 * moves the second argument of STANDIN_SECOND from the definer to STANDIN_SKIP.
 */
#define STANDIN_OMITTED_1 ,
#define STANDIN_SECOND(a, b, ...) b
#define STANDIN_PICK(probe) STANDIN_SECOND(probe STANDIN_SKIP, STANDIN_GETTER, ~)
#define STANDIN_PICK_1(v) STANDIN_PICK(STANDIN_OMITTED_##v)
#define STANDIN_PICK_0(v) STANDIN_PICK_1(v) /* expands OMIT_<symbol> to 1 when the build defined it */
#define STANDIN_SKIP(fn, type)
#define STANDIN_GETTER(fn, type)                                                 \
    EXPORT nvmlReturn_t fn(nvmlDevice_t device, type *out) {                     \
        sdev *d;                                                                 \
        nvmlReturn_t r = enter_dev(F_##fn, device, out != NULL, &d);             \
        if (r) return r;                                                         \
        if (d->reading[R_##fn] == UNSET) return leave(NVML_ERROR_NOT_SUPPORTED); \
        *out = (type)d->reading[R_##fn];                                         \
        return leave(NVML_SUCCESS);                                              \
    }
#define READING(fn, type, key, lo, hi) STANDIN_PICK_0(OMIT_##fn)(fn, type)
#include "standin_readings.def"
#undef READING

/* ------------------------------------------------------------------------------------------------ init */

static nvmlReturn_t do_init(unsigned int flags) {
    pthread_mutex_lock(&mu);
    if (refcount > 0) {
        refcount++;
        return leave(NVML_SUCCESS);
    }
    /* Read at init, not at load: in-process tests switch state files between sessions. */
    const char *p = getenv("GPUWATCHD_SIM_STATE");
    if (!p || !*p || strlen(p) >= sizeof state_path) return leave(NVML_ERROR_DRIVER_NOT_LOADED);
    copy_str(state_path, sizeof state_path, p);
    free_state(st);
    st = NULL;
    memset(&sig, 0, sizeof sig);
    maybe_reload(1);
    if (!st) return leave(NVML_ERROR_DRIVER_NOT_LOADED);
    if (st->init_error) return leave((nvmlReturn_t)st->init_error);
    if (st->ndev == 0 && !(flags & NVML_INIT_FLAG_NO_GPUS)) return leave(NVML_ERROR_GPU_NOT_FOUND);
    /* Enumeration is fixed here, as in a long-lived real session. */
    enum_n = st->ndev;
    for (int i = 0; i < enum_n; i++) {
        copy_str(enum_uuid[i], sizeof enum_uuid[i], st->devs[i].uuid);
        handles[i].slot = i;
        handles[i].gen = 0;
        handles[i].didx = -1;
    }
    refcount = 1;
    return leave(NVML_SUCCESS);
}

#ifndef OMIT_nvmlInitWithFlags
EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) { return do_init(flags); }
#endif

#ifndef OMIT_nvmlInit_v2
EXPORT nvmlReturn_t nvmlInit_v2(void) { return do_init(0); }
#endif

#ifndef OMIT_nvmlShutdown
EXPORT nvmlReturn_t nvmlShutdown(void) {
    pthread_mutex_lock(&mu);
    if (!refcount) return leave(NVML_ERROR_UNINITIALIZED);
    if (--refcount == 0) enum_n = 0;
    return leave(NVML_SUCCESS);
}
#endif

#ifndef OMIT_nvmlErrorString
EXPORT const char *nvmlErrorString(nvmlReturn_t result) {
    /* Same texts as pynvml's table (which mirrors the real library) so messages read alike. */
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_INSUFFICIENT_POWER: return "Insufficient External Power";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_IRQ_ISSUE: return "Interrupt Request Issue";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_CORRUPTED_INFOROM: return "Corrupted infoROM";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires restart";
    case NVML_ERROR_OPERATING_SYSTEM: return "The operating system has blocked the request.";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "RM has detected an NVML/RM version mismatch.";
    case NVML_ERROR_IN_USE: return "In use by another client";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    case NVML_ERROR_NO_DATA: return "No data";
    case NVML_ERROR_VGPU_ECC_NOT_SUPPORTED: return "The requested vgpu operation is not available on target device, because ECC is enabled";
    case NVML_ERROR_INSUFFICIENT_RESOURCES: return "Insufficient Resources";
    case NVML_ERROR_FREQ_NOT_SUPPORTED: return "Frequency not supported";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    case NVML_ERROR_DEPRECATED: return "Deprecated";
    case NVML_ERROR_NOT_READY: return "System is not in ready state";
    case NVML_ERROR_GPU_NOT_FOUND: return "No GPUs were found";
    case NVML_ERROR_INVALID_STATE: return "Resource not in correct state";
    case NVML_ERROR_RESET_TYPE_NOT_SUPPORTED: return "Reset type not supported";
    case NVML_ERROR_UNKNOWN: return "Unknown Error";
    default: return "Unknown Error";
    }
}
#endif

/* ------------------------------------------------------------------------------------------------ system */

static nvmlReturn_t enter_sys(void) {
    pthread_mutex_lock(&mu);
    if (!refcount) return leave(NVML_ERROR_UNINITIALIZED);
    maybe_reload(0);
    return NVML_SUCCESS;
}

#ifndef OMIT_nvmlSystemGetDriverVersion
EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    if (!version) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = enter_sys();
    return r ? r : (st->driver[0] ? put_str(st->driver, version, length) : leave(NVML_ERROR_NOT_SUPPORTED));
}
#endif

#ifndef OMIT_nvmlSystemGetNVMLVersion
EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    if (!version) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = enter_sys();
    return r ? r : (st->nvml[0] ? put_str(st->nvml, version, length) : leave(NVML_ERROR_NOT_SUPPORTED));
}
#endif

#ifndef OMIT_nvmlSystemGetCudaDriverVersion
EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v) {
    if (!v) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = enter_sys();
    if (r) return r;
    if (st->cuda == UNSET) return leave(NVML_ERROR_NOT_SUPPORTED);
    *v = (int)st->cuda;
    return leave(NVML_SUCCESS);
}
#endif

#ifndef OMIT_nvmlSystemGetCudaDriverVersion_v2
EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) {
    if (!v) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = enter_sys();
    if (r) return r;
    /* _v2 asks libcuda; no CUDA version in the state stands for "libcuda.so.1 absent" (nvml.h). */
    if (st->cuda == UNSET) return leave(NVML_ERROR_LIBRARY_NOT_FOUND);
    *v = (int)st->cuda;
    return leave(NVML_SUCCESS);
}
#endif

/* ------------------------------------------------------------------------------------------------ handles */

#ifndef OMIT_nvmlDeviceGetCount_v2
EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&mu);
    if (!refcount) return leave(NVML_ERROR_UNINITIALIZED);
    *count = (unsigned int)enum_n;
    return leave(NVML_SUCCESS);
}
#endif

/* Shared tail of the three handle lookups: delay, lost, explicit override (never "*", see docs/sim-state.md). */
static nvmlReturn_t hand_out(int fid, int slot, nvmlDevice_t *device) {
    sdev *d = lookup(&handles[slot]);
    if (d) {
        int ms = d->has_overrides ? d->delay[fid] : 0;
        if (ms) {
            run_delay(fid, slot, ms);
            if (!refcount || slot >= enum_n) return leave(NVML_ERROR_UNINITIALIZED);
            d = lookup(&handles[slot]);
        }
    }
    if (!d || d->lost) return leave(NVML_ERROR_GPU_IS_LOST);
    int e = err_for(d, fid, 0);
    if (e) return leave((nvmlReturn_t)e);
    *device = &handles[slot];
    return leave(NVML_SUCCESS);
}

#ifndef OMIT_nvmlDeviceGetHandleByIndex_v2
EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    pthread_mutex_lock(&mu);
    if (!refcount) return leave(NVML_ERROR_UNINITIALIZED);
    if (!device || index >= (unsigned int)enum_n) return leave(NVML_ERROR_INVALID_ARGUMENT);
    maybe_reload(0);
    return hand_out(F_nvmlDeviceGetHandleByIndex_v2, (int)index, device);
}
#endif

#ifndef OMIT_nvmlDeviceGetHandleByUUID
EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    pthread_mutex_lock(&mu);
    if (!refcount) return leave(NVML_ERROR_UNINITIALIZED);
    if (!uuid || !device) return leave(NVML_ERROR_INVALID_ARGUMENT);
    maybe_reload(0);
    /* nvml.h: GPU_IS_LOST "if any GPU has fallen off the bus", even when looking up a healthy one. */
    int slot = -1;
    for (int i = 0; i < enum_n; i++) {
        sdev *d = lookup(&handles[i]);
        if (!d || d->lost) return leave(NVML_ERROR_GPU_IS_LOST);
        if (strcmp(enum_uuid[i], uuid) == 0) slot = i;
    }
    if (slot < 0) return leave(NVML_ERROR_NOT_FOUND);
    return hand_out(F_nvmlDeviceGetHandleByUUID, slot, device);
}
#endif

#ifndef OMIT_nvmlDeviceGetHandleByPciBusId_v2
EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *busId, nvmlDevice_t *device) {
    if (!busId || !device) return NVML_ERROR_INVALID_ARGUMENT;
    /* nvml.h accepts "%x:%x:%x.%x", "%x:%x:%x" and "%x:%x.%x" (domain 0). */
    unsigned int dom = 0, bus = 0, dv = 0, fnc = 0;
    char tail;
    if (sscanf(busId, "%x:%x:%x.%x%c", &dom, &bus, &dv, &fnc, &tail) == 4) {
    } else if (sscanf(busId, "%x:%x:%x%c", &dom, &bus, &dv, &tail) == 3) {
    } else if (sscanf(busId, "%x:%x.%x%c", &bus, &dv, &fnc, &tail) == 3) {
        dom = 0;
    } else {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    pthread_mutex_lock(&mu);
    if (!refcount) return leave(NVML_ERROR_UNINITIALIZED);
    maybe_reload(0);
    for (int i = 0; i < enum_n; i++) {
        sdev *d = lookup(&handles[i]);
        if (d && d->pci[0] == dom && d->pci[1] == bus && d->pci[2] == dv)
            return hand_out(F_nvmlDeviceGetHandleByPciBusId_v2, i, device);
    }
    return leave(NVML_ERROR_NOT_FOUND);
}
#endif

/* ------------------------------------------------------------------------------------------------ identity */

#ifndef OMIT_nvmlDeviceGetIndex
EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    sdev *d;
    nvmlReturn_t r = enter_dev(F_nvmlDeviceGetIndex, device, index != NULL, &d);
    if (r) return r;
    *index = (unsigned int)device->slot;
    return leave(NVML_SUCCESS);
}
#endif

#ifndef OMIT_nvmlDeviceGetUUID
EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    sdev *d;
    nvmlReturn_t r = enter_dev(F_nvmlDeviceGetUUID, device, uuid != NULL, &d);
    return r ? r : put_str(d->uuid, uuid, length);
}
#endif

#ifndef OMIT_nvmlDeviceGetName
EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    sdev *d;
    nvmlReturn_t r = enter_dev(F_nvmlDeviceGetName, device, name != NULL, &d);
    return r ? r : put_str(d->name, name, length);
}
#endif

#ifndef OMIT_nvmlDeviceGetSerial
EXPORT nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t device, char *serial, unsigned int length) {
    sdev *d;
    nvmlReturn_t r = enter_dev(F_nvmlDeviceGetSerial, device, serial != NULL, &d);
    if (r) return r;
    return d->has_serial ? put_str(d->serial, serial, length) : leave(NVML_ERROR_NOT_SUPPORTED);
}
#endif


#ifndef OMIT_nvmlDeviceGetPciInfo_v3
EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    sdev *d;
    nvmlReturn_t r = enter_dev(F_nvmlDeviceGetPciInfo_v3, device, pci != NULL, &d);
    if (r) return r;
    if (d->pci[0] == UNSET) return leave(NVML_ERROR_NOT_SUPPORTED);
    memset(pci, 0, sizeof(*pci));
    pci->domain = (unsigned int)d->pci[0];
    pci->bus = (unsigned int)d->pci[1];
    pci->device = (unsigned int)d->pci[2];
    pci->pciDeviceId = (unsigned int)d->pci[3];
    pci->pciSubSystemId = (unsigned int)d->pci[4];
    snprintf(pci->busId, sizeof pci->busId, NVML_DEVICE_PCI_BUS_ID_FMT, pci->domain, pci->bus, pci->device);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, NVML_DEVICE_PCI_BUS_ID_LEGACY_FMT, pci->domain & 0xFFFF,
             pci->bus, pci->device);
    return leave(NVML_SUCCESS);
}
#endif

/* ------------------------------------------------------------------------------------------------ memory, activity */

#ifndef OMIT_nvmlDeviceGetMemoryInfo
EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    sdev *d;
    nvmlReturn_t r = enter_dev(F_nvmlDeviceGetMemoryInfo, device, memory != NULL, &d);
    if (r) return r;
    if (d->mem[0] == UNSET) return leave(NVML_ERROR_NOT_SUPPORTED);
    /* v1 "used" is the sum of reserved and allocated (nvml.h nvmlMemory_t) */
    memory->total = (unsigned long long)d->mem[0];
    memory->used = (unsigned long long)(d->mem[1] + d->mem[2]);
    memory->free = (unsigned long long)(d->mem[0] - d->mem[1] - d->mem[2]);
    return leave(NVML_SUCCESS);
}
#endif

#ifndef OMIT_nvmlDeviceGetMemoryInfo_v2
EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    if (memory && memory->version != nvmlMemory_v2) {
        pthread_mutex_lock(&mu);
        return leave(refcount ? NVML_ERROR_ARGUMENT_VERSION_MISMATCH : NVML_ERROR_UNINITIALIZED);
    }
    sdev *d;
    nvmlReturn_t r = enter_dev(F_nvmlDeviceGetMemoryInfo_v2, device, memory != NULL, &d);
    if (r) return r;
    if (d->mem[0] == UNSET) return leave(NVML_ERROR_NOT_SUPPORTED);
    memory->total = (unsigned long long)d->mem[0];
    memory->reserved = (unsigned long long)d->mem[1];
    memory->used = (unsigned long long)d->mem[2];
    memory->free = (unsigned long long)(d->mem[0] - d->mem[1] - d->mem[2]);
    return leave(NVML_SUCCESS);
}
#endif

#ifndef OMIT_nvmlDeviceGetUtilizationRates
EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *u) {
    sdev *d;
    nvmlReturn_t r = enter_dev(F_nvmlDeviceGetUtilizationRates, device, u != NULL, &d);
    if (r) return r;
    if (d->util[0] == UNSET || d->util[1] == UNSET) return leave(NVML_ERROR_NOT_SUPPORTED);
    u->gpu = (unsigned int)d->util[0];
    u->memory = (unsigned int)d->util[1];
    return leave(NVML_SUCCESS);
}
#endif

#ifndef OMIT_nvmlDeviceGetPerformanceState
EXPORT nvmlReturn_t nvmlDeviceGetPerformanceState(nvmlDevice_t device, nvmlPstates_t *p) {
    sdev *d;
    nvmlReturn_t r = enter_dev(F_nvmlDeviceGetPerformanceState, device, p != NULL, &d);
    if (r) return r;
    if (d->pstate == UNSET) return leave(NVML_ERROR_NOT_SUPPORTED);
    *p = (nvmlPstates_t)d->pstate;
    return leave(NVML_SUCCESS);
}
#endif

#ifndef OMIT_nvmlDeviceGetPowerState
EXPORT nvmlReturn_t nvmlDeviceGetPowerState(nvmlDevice_t device, nvmlPstates_t *p) {
    sdev *d;
    nvmlReturn_t r = enter_dev(F_nvmlDeviceGetPowerState, device, p != NULL, &d);
    if (r) return r;
    if (d->pstate == UNSET) return leave(NVML_ERROR_NOT_SUPPORTED);
    *p = (nvmlPstates_t)d->pstate;
    return leave(NVML_SUCCESS);
}
#endif

/* ------------------------------------------------------------------------------------------------ thermal, fans */

#ifndef OMIT_nvmlDeviceGetTemperature
EXPORT nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, nvmlTemperatureSensors_t sensor,
                                             unsigned int *temp) {
    sdev *d;
    nvmlReturn_t r = enter_dev(F_nvmlDeviceGetTemperature, device, temp != NULL && sensor == NVML_TEMPERATURE_GPU,
                               &d);
    return r ? r : put_uint(d->temp, temp);
}
#endif

#ifndef OMIT_nvmlDeviceGetTemperatureV
EXPORT nvmlReturn_t nvmlDeviceGetTemperatureV(nvmlDevice_t device, nvmlTemperature_t *t) {
    if (t && t->version != nvmlTemperature_v1) {
        pthread_mutex_lock(&mu);
        return leave(refcount ? NVML_ERROR_ARGUMENT_VERSION_MISMATCH : NVML_ERROR_UNINITIALIZED);
    }
    sdev *d;
    nvmlReturn_t r = enter_dev(F_nvmlDeviceGetTemperatureV, device,
                               t != NULL && t->sensorType == NVML_TEMPERATURE_GPU, &d);
    if (r) return r;
    if (d->temp == UNSET) return leave(NVML_ERROR_NOT_SUPPORTED);
    t->temperature = (int)d->temp;
    return leave(NVML_SUCCESS);
}
#endif

#ifndef OMIT_nvmlDeviceGetMarginTemperature
/* nvmlMarginTemperature_v1_t (nvml.h): version, int marginTemperature -- the distance to the nearest slowdown
 * threshold; a struct of another version is refused like every versioned call here. */
EXPORT nvmlReturn_t nvmlDeviceGetMarginTemperature(nvmlDevice_t device, nvmlMarginTemperature_t *m) {
    if (m && m->version != nvmlMarginTemperature_v1) {
        pthread_mutex_lock(&mu);
        return leave(refcount ? NVML_ERROR_ARGUMENT_VERSION_MISMATCH : NVML_ERROR_UNINITIALIZED);
    }
    sdev *d;
    nvmlReturn_t r = enter_dev(F_nvmlDeviceGetMarginTemperature, device, m != NULL, &d);
    if (r) return r;
    if (d->margin == UNSET) return leave(NVML_ERROR_NOT_SUPPORTED);
    m->marginTemperature = (int)d->margin;
    return leave(NVML_SUCCESS);
}
#endif

#ifndef OMIT_nvmlDeviceGetTemperatureThreshold
EXPORT nvmlReturn_t nvmlDeviceGetTemperatureThreshold(nvmlDevice_t device, nvmlTemperatureThresholds_t type,
                                                      unsigned int *temp) {
    sdev *d;
    nvmlReturn_t r = enter_dev(F_nvmlDeviceGetTemperatureThreshold, device,
                               temp != NULL && type < NVML_TEMPERATURE_THRESHOLD_COUNT, &d);
    if (r) return r;
    /* acoustic / GPS thresholds are not modelled: NOT_SUPPORTED, as on most boards */
    return put_uint(type <= NVML_TEMPERATURE_THRESHOLD_GPU_MAX ? d->tthr[type] : UNSET, temp);
}
#endif

#ifndef OMIT_nvmlDeviceGetNumFans
EXPORT nvmlReturn_t nvmlDeviceGetNumFans(nvmlDevice_t device, unsigned int *n) {
    sdev *d;
    nvmlReturn_t r = enter_dev(F_nvmlDeviceGetNumFans, device, n != NULL, &d);
    return r ? r : put_uint(d->fans.n < 0 ? UNSET : d->fans.n, n);
}
#endif

#ifndef OMIT_nvmlDeviceGetFanSpeed_v2
EXPORT nvmlReturn_t nvmlDeviceGetFanSpeed_v2(nvmlDevice_t device, unsigned int fan, unsigned int *speed) {
    sdev *d;
    nvmlReturn_t r = enter_dev(F_nvmlDeviceGetFanSpeed_v2, device, speed != NULL, &d);
    if (r) return r;
    if (d->fans.n < 0) return leave(NVML_ERROR_NOT_SUPPORTED);
    if (fan >= (unsigned int)d->fans.n) return leave(NVML_ERROR_INVALID_ARGUMENT);
    return put_uint(d->fans.v[fan], speed);
}
#endif

#ifndef OMIT_nvmlDeviceGetFanSpeed
EXPORT nvmlReturn_t nvmlDeviceGetFanSpeed(nvmlDevice_t device, unsigned int *speed) {
    sdev *d;
    nvmlReturn_t r = enter_dev(F_nvmlDeviceGetFanSpeed, device, speed != NULL, &d);
    if (r) return r;
    return put_uint(d->fans.n > 0 ? d->fans.v[0] : UNSET, speed);
}
#endif

/* ------------------------------------------------------------------------------------------------ power */

#ifndef OMIT_nvmlDeviceGetPowerManagementLimitConstraints
EXPORT nvmlReturn_t nvmlDeviceGetPowerManagementLimitConstraints(nvmlDevice_t device, unsigned int *mn,
                                                                 unsigned int *mx) {
    sdev *d;
    nvmlReturn_t r = enter_dev(F_nvmlDeviceGetPowerManagementLimitConstraints, device, mn && mx, &d);
    if (r) return r;
    if (d->pcons[0] == UNSET || d->pcons[1] == UNSET) return leave(NVML_ERROR_NOT_SUPPORTED);
    *mn = (unsigned int)d->pcons[0];
    *mx = (unsigned int)d->pcons[1];
    return leave(NVML_SUCCESS);
}
#endif

#ifndef OMIT_nvmlDeviceGetCudaComputeCapability
EXPORT nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor) {
    sdev *d;
    nvmlReturn_t r = enter_dev(F_nvmlDeviceGetCudaComputeCapability, device, major && minor, &d);
    if (r) return r;
    if (d->cc[0] == UNSET || d->cc[1] == UNSET) return leave(NVML_ERROR_NOT_SUPPORTED);
    *major = (int)d->cc[0];
    *minor = (int)d->cc[1];
    return leave(NVML_SUCCESS);
}
#endif

/* ------------------------------------------------------------------------------------------------ media engines */

/* NVML's media-engine sampling period: the stand-in answers a fixed 1/6 s, the shortest real drivers report. */
#define CODEC_SAMPLING_PERIOD_US 166667u

static __attribute__((unused)) nvmlReturn_t get_codec(int fn, int which, nvmlDevice_t device, unsigned int *util, unsigned int *period) {
    sdev *d;
    nvmlReturn_t r = enter_dev(fn, device, util != NULL && period != NULL, &d);
    if (r) return r;
    if (d->codec[which] == UNSET) return leave(NVML_ERROR_NOT_SUPPORTED);
    *util = (unsigned int)d->codec[which];
    *period = CODEC_SAMPLING_PERIOD_US;
    return leave(NVML_SUCCESS);
}

#ifndef OMIT_nvmlDeviceGetEncoderUtilization
EXPORT nvmlReturn_t nvmlDeviceGetEncoderUtilization(nvmlDevice_t device, unsigned int *utilization,
                                                    unsigned int *samplingPeriodUs) {
    return get_codec(F_nvmlDeviceGetEncoderUtilization, 0, device, utilization, samplingPeriodUs);
}
#endif

#ifndef OMIT_nvmlDeviceGetDecoderUtilization
EXPORT nvmlReturn_t nvmlDeviceGetDecoderUtilization(nvmlDevice_t device, unsigned int *utilization,
                                                    unsigned int *samplingPeriodUs) {
    return get_codec(F_nvmlDeviceGetDecoderUtilization, 1, device, utilization, samplingPeriodUs);
}
#endif

#ifndef OMIT_nvmlDeviceGetEncoderStats
EXPORT nvmlReturn_t nvmlDeviceGetEncoderStats(nvmlDevice_t device, unsigned int *sessionCount, unsigned int *averageFps,
                                              unsigned int *averageLatency) {
    sdev *d;
    nvmlReturn_t r = enter_dev(F_nvmlDeviceGetEncoderStats, device,
                               sessionCount != NULL && averageFps != NULL && averageLatency != NULL, &d);
    if (r) return r;
    if (d->encstats[0] == UNSET) return leave(NVML_ERROR_NOT_SUPPORTED);
    *sessionCount = (unsigned int)d->encstats[0];
    *averageFps = (unsigned int)d->encstats[1];
    *averageLatency = (unsigned int)d->encstats[2];
    return leave(NVML_SUCCESS);
}
#endif

/* ------------------------------------------------------------------------------------------------ field values */

/* The field ids the stand-in serves (sdev.fv order; gpuwatchd/sim/state.py _FIELD_VALUE_KEYS), with the value types
 * real drivers answer them in. Any other id, or one unset in the state, answers NOT_SUPPORTED in its own nvmlReturn,
 * while the call itself succeeds (nvml.h: "you must check the nvmlReturn field of each value"). */
static const struct {
    unsigned int id;
    nvmlValueType_t type;
} FIELD_VALUES[FIELD_VALUE_COUNT] = {
    {NVML_FI_DEV_MEMORY_TEMP, NVML_VALUE_TYPE_UNSIGNED_INT},
    {NVML_FI_DEV_PCIE_REPLAY_ROLLOVER_COUNTER, NVML_VALUE_TYPE_UNSIGNED_INT},
    {NVML_FI_DEV_PCIE_COUNT_CORRECTABLE_ERRORS, NVML_VALUE_TYPE_UNSIGNED_LONG_LONG},
    {NVML_FI_DEV_PCIE_COUNT_NON_FATAL_ERROR, NVML_VALUE_TYPE_UNSIGNED_LONG_LONG},
    {NVML_FI_DEV_PCIE_COUNT_FATAL_ERROR, NVML_VALUE_TYPE_UNSIGNED_LONG_LONG},
    {NVML_FI_DEV_PCIE_COUNT_NAKS_RECEIVED, NVML_VALUE_TYPE_UNSIGNED_LONG_LONG},
    {NVML_FI_DEV_PCIE_COUNT_NAKS_SENT, NVML_VALUE_TYPE_UNSIGNED_LONG_LONG},
    {NVML_FI_DEV_PCIE_COUNT_BAD_TLP, NVML_VALUE_TYPE_UNSIGNED_LONG_LONG},
    {NVML_FI_DEV_PCIE_COUNT_BAD_DLLP, NVML_VALUE_TYPE_UNSIGNED_LONG_LONG},
    {NVML_FI_DEV_PCIE_COUNT_LCRC_ERROR, NVML_VALUE_TYPE_UNSIGNED_LONG_LONG},
    {NVML_FI_DEV_PCIE_COUNT_RECEIVER_ERROR, NVML_VALUE_TYPE_UNSIGNED_LONG_LONG},
    {NVML_FI_DEV_PCIE_COUNT_UNSUPPORTED_REQ, NVML_VALUE_TYPE_UNSIGNED_LONG_LONG},
};

#ifndef OMIT_nvmlDeviceGetFieldValues
EXPORT nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int valuesCount, nvmlFieldValue_t *values) {
    sdev *d;
    nvmlReturn_t r = enter_dev(F_nvmlDeviceGetFieldValues, device, values != NULL && valuesCount >= 0, &d);
    if (r) return r;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    for (int i = 0; i < valuesCount; i++) {
        nvmlFieldValue_t *v = &values[i];
        v->timestamp = (long long)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
        v->latencyUsec = 0;
        v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        for (size_t k = 0; k < sizeof(FIELD_VALUES) / sizeof(FIELD_VALUES[0]); k++) {
            if (FIELD_VALUES[k].id != v->fieldId || d->fv[k] == UNSET) continue;
            v->valueType = FIELD_VALUES[k].type;
            if (v->valueType == NVML_VALUE_TYPE_UNSIGNED_INT) v->value.uiVal = (unsigned int)d->fv[k];
            else v->value.ullVal = (unsigned long long)d->fv[k];
            v->nvmlReturn = NVML_SUCCESS;
        }
        /* NVML_FI_DEV_PCIE_COUNT_LANE_ERROR: "per lane error counter with scope as PCIe lane number" (NVML
         * release notes, r550); a lane past the state's list is NOT_SUPPORTED like an unknown id */
        if (v->fieldId == NVML_FI_DEV_PCIE_COUNT_LANE_ERROR && v->scopeId < (unsigned int)(d->pcie_lanes.n > 0 ? d->pcie_lanes.n : 0)
            && d->pcie_lanes.v[v->scopeId] != UNSET) {
            v->valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
            v->value.ullVal = (unsigned long long)d->pcie_lanes.v[v->scopeId];
            v->nvmlReturn = NVML_SUCCESS;
        }
        if (v->nvmlReturn == NVML_ERROR_NOT_SUPPORTED) nvlink_field_value(d, v); /* standin_nvlink.c */
    }
    return leave(NVML_SUCCESS);
}
#endif

/* ------------------------------------------------------------------------------------------------ clocks */

#ifndef OMIT_nvmlDeviceGetClockInfo
EXPORT nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, nvmlClockType_t type, unsigned int *clock) {
    sdev *d;
    nvmlReturn_t r = enter_dev(F_nvmlDeviceGetClockInfo, device, clock != NULL && type < NVML_CLOCK_COUNT, &d);
    return r ? r : put_uint(d->clk[type], clock);
}
#endif

#ifndef OMIT_nvmlDeviceGetMaxClockInfo
EXPORT nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t device, nvmlClockType_t type, unsigned int *clock) {
    sdev *d;
    nvmlReturn_t r = enter_dev(F_nvmlDeviceGetMaxClockInfo, device, clock != NULL && type < NVML_CLOCK_COUNT, &d);
    return r ? r : put_uint(d->maxclk[type], clock);
}
#endif


#ifndef OMIT_nvmlDeviceGetViolationStatus
EXPORT nvmlReturn_t nvmlDeviceGetViolationStatus(nvmlDevice_t device, nvmlPerfPolicyType_t policy,
                                                 nvmlViolationTime_t *vt) {
    int valid = policy <= NVML_PERF_POLICY_RELIABILITY || policy == NVML_PERF_POLICY_TOTAL_APP_CLOCKS ||
                policy == NVML_PERF_POLICY_TOTAL_BASE_CLOCKS;
    sdev *d;
    nvmlReturn_t r = enter_dev(F_nvmlDeviceGetViolationStatus, device, vt != NULL && valid, &d);
    if (r) return r;
    if (d->viol[policy] == UNSET) return leave(NVML_ERROR_NOT_SUPPORTED);
    vt->violationTime = (unsigned long long)d->viol[policy];
    vt->referenceTime = (unsigned long long)(st->clock * 1e6); /* CPU timestamp in us (nvml.h) */
    return leave(NVML_SUCCESS);
}
#endif

/* ------------------------------------------------------------------------------------------------ ECC, pages, rows */

#ifndef OMIT_nvmlDeviceGetEccMode
EXPORT nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t device, nvmlEnableState_t *cur, nvmlEnableState_t *pend) {
    sdev *d;
    nvmlReturn_t r = enter_dev(F_nvmlDeviceGetEccMode, device, cur && pend, &d);
    if (r) return r;
    if (d->ecc_mode[0] == UNSET || d->ecc_mode[1] == UNSET) return leave(NVML_ERROR_NOT_SUPPORTED);
    *cur = d->ecc_mode[0] ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    *pend = d->ecc_mode[1] ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    return leave(NVML_SUCCESS);
}
#endif

/* ECC counters "require ECC Mode to be enabled" (nvml.h): ECC off reads as NOT_SUPPORTED. */
static long long ecc_count(const sdev *d, unsigned int type, unsigned int counter) {
    if (d->ecc_mode[0] == 0) return UNSET;
    return d->ecc[counter * 2 + type];
}

#ifndef OMIT_nvmlDeviceGetTotalEccErrors
EXPORT nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, nvmlMemoryErrorType_t type,
                                                nvmlEccCounterType_t counter, unsigned long long *count) {
    sdev *d;
    nvmlReturn_t r = enter_dev(F_nvmlDeviceGetTotalEccErrors, device,
                               count && type < NVML_MEMORY_ERROR_TYPE_COUNT && counter < NVML_ECC_COUNTER_TYPE_COUNT,
                               &d);
    return r ? r : put_ull(ecc_count(d, type, counter), count);
}
#endif

#ifndef OMIT_nvmlDeviceGetMemoryErrorCounter
EXPORT nvmlReturn_t nvmlDeviceGetMemoryErrorCounter(nvmlDevice_t device, nvmlMemoryErrorType_t type,
                                                    nvmlEccCounterType_t counter, nvmlMemoryLocation_t loc,
                                                    unsigned long long *count) {
    sdev *d;
    nvmlReturn_t r = enter_dev(F_nvmlDeviceGetMemoryErrorCounter, device,
                               count && type < NVML_MEMORY_ERROR_TYPE_COUNT &&
                                   counter < NVML_ECC_COUNTER_TYPE_COUNT && loc < NVML_MEMORY_LOCATION_COUNT,
                               &d);
    if (r) return r;
    long long v = ecc_count(d, type, counter);
    /* The state's ECC totals are all attributed to device memory; other locations count 0. */
    if (v != UNSET && loc != NVML_MEMORY_LOCATION_DEVICE_MEMORY) v = 0;
    return put_ull(v, count);
}
#endif

static nvmlReturn_t retired(int fid, nvmlDevice_t device, nvmlPageRetirementCause_t cause, unsigned int *count,
                            unsigned long long *addrs, unsigned long long *times) {
    sdev *d;
    nvmlReturn_t r = enter_dev(fid, device, count && cause < NVML_PAGE_RETIREMENT_CAUSE_COUNT, &d);
    if (r) return r;
    const slist *l = &d->rp[cause];
    if (d->rp_pending == UNSET || l->n < 0) return leave(NVML_ERROR_NOT_SUPPORTED);
    unsigned int n = (unsigned int)l->n;
    if (*count < n) {
        *count = n;
        return leave(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    if (n && !addrs) return leave(NVML_ERROR_INVALID_ARGUMENT);
    for (unsigned int i = 0; i < n; i++) {
        addrs[i] = (unsigned long long)l->v[i];
        if (times) times[i] = (unsigned long long)st->clock;
    }
    *count = n;
    return leave(NVML_SUCCESS);
}

#ifndef OMIT_nvmlDeviceGetRetiredPages
EXPORT nvmlReturn_t nvmlDeviceGetRetiredPages(nvmlDevice_t device, nvmlPageRetirementCause_t cause,
                                              unsigned int *pageCount, unsigned long long *addresses) {
    return retired(F_nvmlDeviceGetRetiredPages, device, cause, pageCount, addresses, NULL);
}
#endif

#ifndef OMIT_nvmlDeviceGetRetiredPages_v2
EXPORT nvmlReturn_t nvmlDeviceGetRetiredPages_v2(nvmlDevice_t device, nvmlPageRetirementCause_t cause,
                                                 unsigned int *pageCount, unsigned long long *addresses,
                                                 unsigned long long *timestamps) {
    return retired(F_nvmlDeviceGetRetiredPages_v2, device, cause, pageCount, addresses, timestamps);
}
#endif

#ifndef OMIT_nvmlDeviceGetRetiredPagesPendingStatus
EXPORT nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t device, nvmlEnableState_t *pending) {
    sdev *d;
    nvmlReturn_t r = enter_dev(F_nvmlDeviceGetRetiredPagesPendingStatus, device, pending != NULL, &d);
    if (r) return r;
    if (d->rp_pending == UNSET) return leave(NVML_ERROR_NOT_SUPPORTED);
    *pending = d->rp_pending ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    return leave(NVML_SUCCESS);
}
#endif

#ifndef OMIT_nvmlDeviceGetRemappedRows
EXPORT nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corr, unsigned int *unc,
                                              unsigned int *pending, unsigned int *failure) {
    sdev *d;
    nvmlReturn_t r = enter_dev(F_nvmlDeviceGetRemappedRows, device, corr && unc && pending && failure, &d);
    if (r) return r;
    for (int i = 0; i < 4; i++)
        if (d->remap[i] == UNSET) return leave(NVML_ERROR_NOT_SUPPORTED);
    *corr = (unsigned int)d->remap[0];
    *unc = (unsigned int)d->remap[1];
    *pending = (unsigned int)d->remap[2];
    *failure = (unsigned int)d->remap[3];
    return leave(NVML_SUCCESS);
}
#endif

/* ------------------------------------------------------------------------------------------------ PCIe, NVLink, MIG */

#ifndef OMIT_nvmlDeviceGetCurrPcieLinkGeneration
GET_UINT(nvmlDeviceGetCurrPcieLinkGeneration, pcie[0])
#endif
#ifndef OMIT_nvmlDeviceGetMaxPcieLinkGeneration
GET_UINT(nvmlDeviceGetMaxPcieLinkGeneration, pcie[1])
#endif
#ifndef OMIT_nvmlDeviceGetGpuMaxPcieLinkGeneration
GET_UINT(nvmlDeviceGetGpuMaxPcieLinkGeneration, pcie[2])
#endif
#ifndef OMIT_nvmlDeviceGetCurrPcieLinkWidth
GET_UINT(nvmlDeviceGetCurrPcieLinkWidth, pcie[3])
#endif
#ifndef OMIT_nvmlDeviceGetMaxPcieLinkWidth
GET_UINT(nvmlDeviceGetMaxPcieLinkWidth, pcie[4])
#endif
#ifndef OMIT_nvmlDeviceGetPcieReplayCounter
GET_UINT(nvmlDeviceGetPcieReplayCounter, pcie[7])
#endif

#ifndef OMIT_nvmlDeviceGetPcieThroughput
EXPORT nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t device, nvmlPcieUtilCounter_t counter,
                                                unsigned int *value) {
    sdev *d;
    nvmlReturn_t r = enter_dev(F_nvmlDeviceGetPcieThroughput, device, value && counter < NVML_PCIE_UTIL_COUNT, &d);
    return r ? r : put_uint(d->pcie[5 + counter], value);
}
#endif

#ifndef OMIT_nvmlDeviceGetNvLinkState
EXPORT nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, nvmlEnableState_t *active) {
    sdev *d;
    nvmlReturn_t r = enter_dev(F_nvmlDeviceGetNvLinkState, device, active != NULL, &d);
    if (r) return r;
    if (d->nvlink.n < 0) return leave(NVML_ERROR_NOT_SUPPORTED);
    if (link >= (unsigned int)d->nvlink.n) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *active = d->nvlink.v[link] ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    return leave(NVML_SUCCESS);
}
#endif

#ifndef OMIT_nvmlDeviceGetMigMode
EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *cur, unsigned int *pend) {
    sdev *d;
    nvmlReturn_t r = enter_dev(F_nvmlDeviceGetMigMode, device, cur && pend, &d);
    if (r) return r;
    if (d->mig[0] == UNSET || d->mig[1] == UNSET) return leave(NVML_ERROR_NOT_SUPPORTED);
    *cur = (unsigned int)d->mig[0];
    *pend = (unsigned int)d->mig[1];
    return leave(NVML_SUCCESS);
}
#endif

/* ------------------------------------------------------------------------------------------------ processes */

/* Entry i of a process array: nvmlProcessInfo_v1_t (v1) or nvmlProcessInfo_v2_t, whose instance ids are the
 * owner's (a MIG device's own; 0xFFFFFFFF, "no MIG attribution", on a GPU). */
void put_process(void *infos, unsigned int i, const sproc *p, const sdev *owner, int v1) {
    unsigned long long used = p->used == UNSET ? (unsigned long long)NVML_VALUE_NOT_AVAILABLE
                                               : (unsigned long long)p->used;
    if (v1) {
        nvmlProcessInfo_v1_t *o = (nvmlProcessInfo_v1_t *)infos + i;
        o->pid = p->pid;
        o->usedGpuMemory = used;
    } else {
        nvmlProcessInfo_v2_t *o = (nvmlProcessInfo_v2_t *)infos + i;
        o->pid = p->pid;
        o->usedGpuMemory = used;
        o->gpuInstanceId = owner->gi == UNSET ? 0xFFFFFFFFu : (unsigned int)owner->gi;
        o->computeInstanceId = owner->ci == UNSET ? 0xFFFFFFFFu : (unsigned int)owner->ci;
    }
}

/* Two-pass protocol (nvml.h): a count smaller than needed (0 with NULL to ask) -> INSUFFICIENT_SIZE + count.
 * Every version serves the same lists; v1 (the unversioned symbols; drivers before R450) fills the 16-byte
 * nvmlProcessInfo_v1_t {pid, usedGpuMemory}, _v2 (R450 to 510) and _v3 the 24-byte nvmlProcessInfo_v2_t.
 * `unused`: a build omitting every process symbol (the no-process-call driver test) leaves it without callers. */
__attribute__((unused)) static nvmlReturn_t processes(int fid, int kind, nvmlDevice_t device, unsigned int *count,
                                                      void *infos, int v1) {
    sdev *d;
    nvmlReturn_t r = enter_dev(fid, device, count != NULL, &d);
    if (r) return r;
    if (d->nproc[kind] < 0 && !d->nmig) return leave(NVML_ERROR_NOT_SUPPORTED);
    /* A GPU with MIG devices lists every instance's processes after its own (nvml.h: aggregate information). */
    int own = d->nproc[kind] < 0 ? 0 : d->nproc[kind];
    unsigned int n = (unsigned int)(own + (d->nmig ? mig_process_count(d, kind) : 0));
    if (*count < n) {
        *count = n;
        return leave(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    if (n && !infos) return leave(NVML_ERROR_INVALID_ARGUMENT);
    for (unsigned int i = 0; i < (unsigned int)own; i++) put_process(infos, i, &d->proc[kind][i], d, v1);
    if (d->nmig && n > (unsigned int)own) {
        size_t size = v1 ? sizeof(nvmlProcessInfo_v1_t) : sizeof(nvmlProcessInfo_v2_t);
        mig_processes(d, kind, (char *)infos + size * (size_t)own, v1);
    }
    *count = n;
    return leave(NVML_SUCCESS);
}

#ifndef OMIT_nvmlDeviceGetComputeRunningProcesses_v3
EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                            nvmlProcessInfo_t *infos) {
    return processes(F_nvmlDeviceGetComputeRunningProcesses_v3, 0, device, infoCount, infos, 0);
}
#endif

#ifndef OMIT_nvmlDeviceGetGraphicsRunningProcesses_v3
EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                             nvmlProcessInfo_t *infos) {
    return processes(F_nvmlDeviceGetGraphicsRunningProcesses_v3, 1, device, infoCount, infos, 0);
}
#endif

#ifndef OMIT_nvmlDeviceGetComputeRunningProcesses_v2
EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
                                                            nvmlProcessInfo_v2_t *infos) {
    return processes(F_nvmlDeviceGetComputeRunningProcesses_v2, 0, device, infoCount, infos, 0);
}
#endif

#ifndef OMIT_nvmlDeviceGetGraphicsRunningProcesses_v2
EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
                                                             nvmlProcessInfo_v2_t *infos) {
    return processes(F_nvmlDeviceGetGraphicsRunningProcesses_v2, 1, device, infoCount, infos, 0);
}
#endif

#ifndef OMIT_nvmlDeviceGetComputeRunningProcesses
EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int *infoCount,
                                                         nvmlProcessInfo_v1_t *infos) {
    return processes(F_nvmlDeviceGetComputeRunningProcesses, 0, device, infoCount, infos, 1);
}
#endif

#ifndef OMIT_nvmlDeviceGetGraphicsRunningProcesses
EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses(nvmlDevice_t device, unsigned int *infoCount,
                                                          nvmlProcessInfo_v1_t *infos) {
    return processes(F_nvmlDeviceGetGraphicsRunningProcesses, 1, device, infoCount, infos, 1);
}
#endif

/* ------------------------------------------------------------------------------------------------ events */

#ifndef OMIT_nvmlEventSetCreate
EXPORT nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    if (!set) return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&mu);
    if (!refcount) return leave(NVML_ERROR_UNINITIALIZED);
    struct nvmlEventSet_st *s = calloc(1, sizeof(*s));
    if (!s) return leave(NVML_ERROR_MEMORY);
    s->magic = EVSET_MAGIC;
    *set = s;
    return leave(NVML_SUCCESS);
}
#endif

#ifndef OMIT_nvmlDeviceGetSupportedEventTypes
GET_ULL(nvmlDeviceGetSupportedEventTypes, evtypes)
#endif

#ifndef OMIT_nvmlDeviceRegisterEvents
EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long types, nvmlEventSet_t set) {
    sdev *d;
    nvmlReturn_t r = enter_dev(F_nvmlDeviceRegisterEvents, device, set && set->magic == EVSET_MAGIC, &d);
    if (r) return r;
    /* nvml.h: NOT_SUPPORTED if "some of requested event types" are unsupported; then nothing is registered. */
    if (d->evtypes == UNSET || (types & ~(unsigned long long)d->evtypes)) return leave(NVML_ERROR_NOT_SUPPORTED);
    int slot = device->slot;
    if (!set->mask[slot]) set->reg_seq[slot] = st->max_seq; /* events before registration are not recorded */
    set->mask[slot] |= types;
    return leave(NVML_SUCCESS);
}
#endif

/* With mu held: find the next event for this set (lowest seq), or report a lost registered device. */
static nvmlReturn_t poll_event(struct nvmlEventSet_st *s, nvmlEventData_t *data) {
    for (int i = 0; i < enum_n; i++) {
        if (!s->mask[i]) continue;
        sdev *d = lookup(&handles[i]);
        if (!d || d->lost) return NVML_ERROR_GPU_IS_LOST; /* for the whole set, unattributed (nvml.h) */
    }
    const sevent *best = NULL;
    int best_slot = -1;
    for (int e = 0; e < st->nev; e++) {
        const sevent *ev = &st->evs[e];
        if (ev->seq <= s->last_seq || (best && ev->seq >= best->seq)) continue;
        for (int i = 0; i < enum_n; i++) {
            if ((s->mask[i] & ev->type) && ev->seq > s->reg_seq[i] && strcmp(enum_uuid[i], ev->uuid) == 0) {
                best = ev;
                best_slot = i;
                break;
            }
        }
    }
    if (!best) return NVML_ERROR_TIMEOUT;
    s->last_seq = best->seq;
    memset(data, 0, sizeof(*data));
    data->device = &handles[best_slot];
    data->eventType = best->type;
    data->eventData = best->data;
    data->gpuInstanceId = 0xFFFFFFFFu;
    data->computeInstanceId = 0xFFFFFFFFu;
    return NVML_SUCCESS;
}

#ifndef OMIT_nvmlEventSetWait_v2
EXPORT nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
    if (!set || !data || set->magic != EVSET_MAGIC) return NVML_ERROR_INVALID_ARGUMENT;
    long long deadline = mono_ns() + (long long)timeoutms * 1000000LL;
    for (;;) {
        pthread_mutex_lock(&mu);
        if (!refcount) return leave(NVML_ERROR_UNINITIALIZED);
        maybe_reload(0);
        nvmlReturn_t r = poll_event(set, data);
        pthread_mutex_unlock(&mu);
        if (r != NVML_ERROR_TIMEOUT) return r;
        long long left = deadline - mono_ns();
        if (left <= 0) return NVML_ERROR_TIMEOUT;
        sleep_ns(left < SLICE_NS ? left : SLICE_NS);
    }
}
#endif

#ifndef OMIT_nvmlEventSetFree
EXPORT nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    if (!set || set->magic != EVSET_MAGIC) return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&mu);
    if (!refcount) return leave(NVML_ERROR_UNINITIALIZED);
    set->magic = 0;
    free(set);
    return leave(NVML_SUCCESS);
}
#endif
