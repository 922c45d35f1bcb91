/*
 * Shared by the stand-in's translation units: NVIDIA's nvml.h, the in-memory state model, and the state-file parser.
 * See standin.c for the design and gpuwatchd/sim/state.py for the file format.
 */
#ifndef GPUWATCHD_STANDIN_H
#define GPUWATCHD_STANDIN_H

#define _GNU_SOURCE
#define NVML_NO_UNVERSIONED_FUNC_DEFS
#include <nvml.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>


/* Upper bound on enumerated devices; a large HGX node has 8-16, "fleet" scenarios stay far below this. */
#define MAX_DEVICES 1024
#define UNSET LLONG_MIN
#define STATE_MAGIC "GWSIM 1"

/* Every symbol whose return code / delay can be overridden by name, with the rows of standin_readings.def after
 * them; the order defines the F_ ids. */
#define FUNCS(X) \
    X(nvmlDeviceGetHandleByIndex_v2) X(nvmlDeviceGetHandleByUUID) X(nvmlDeviceGetHandleByPciBusId_v2) \
    X(nvmlDeviceGetIndex) X(nvmlDeviceGetUUID) X(nvmlDeviceGetName) X(nvmlDeviceGetSerial) \
    X(nvmlDeviceGetPciInfo_v3) X(nvmlDeviceGetMemoryInfo) \
    X(nvmlDeviceGetMemoryInfo_v2) X(nvmlDeviceGetUtilizationRates) X(nvmlDeviceGetTemperature) \
    X(nvmlDeviceGetTemperatureV) X(nvmlDeviceGetTemperatureThreshold) \
    X(nvmlDeviceGetPowerManagementLimitConstraints) X(nvmlDeviceGetClockInfo) X(nvmlDeviceGetMaxClockInfo) \
    X(nvmlDeviceGetViolationStatus) \
    X(nvmlDeviceGetPerformanceState) X(nvmlDeviceGetPowerState) X(nvmlDeviceGetNumFans) \
    X(nvmlDeviceGetFanSpeed_v2) X(nvmlDeviceGetFanSpeed) X(nvmlDeviceGetEccMode) X(nvmlDeviceGetTotalEccErrors) \
    X(nvmlDeviceGetMemoryErrorCounter) X(nvmlDeviceGetRetiredPages) X(nvmlDeviceGetRetiredPages_v2) \
    X(nvmlDeviceGetRetiredPagesPendingStatus) X(nvmlDeviceGetRemappedRows) \
    X(nvmlDeviceGetCurrPcieLinkGeneration) X(nvmlDeviceGetCurrPcieLinkWidth) \
    X(nvmlDeviceGetMaxPcieLinkGeneration) X(nvmlDeviceGetMaxPcieLinkWidth) \
    X(nvmlDeviceGetGpuMaxPcieLinkGeneration) X(nvmlDeviceGetPcieThroughput) X(nvmlDeviceGetPcieReplayCounter) \
    X(nvmlDeviceGetNvLinkState) X(nvmlDeviceGetMigMode) X(nvmlDeviceGetComputeRunningProcesses_v3) \
    X(nvmlDeviceGetGraphicsRunningProcesses_v3) X(nvmlDeviceGetSupportedEventTypes) X(nvmlDeviceRegisterEvents) \
    X(nvmlDeviceGetComputeRunningProcesses_v2) X(nvmlDeviceGetGraphicsRunningProcesses_v2) \
    X(nvmlDeviceGetComputeRunningProcesses) X(nvmlDeviceGetGraphicsRunningProcesses) \
    X(nvmlDeviceGetEncoderUtilization) X(nvmlDeviceGetDecoderUtilization) X(nvmlDeviceGetFieldValues) \
    X(nvmlDeviceGetEncoderStats) X(nvmlDeviceGetMarginTemperature) \
    X(nvmlDeviceGetProcessUtilization) X(nvmlDeviceGetProcessesUtilizationInfo) \
    X(nvmlGpmQueryDeviceSupport) X(nvmlGpmSampleGet) X(nvmlGpmMigSampleGet) X(nvmlGpmMetricsGet) \
    X(nvmlDeviceGetMaxMigDeviceCount) X(nvmlDeviceGetMigDeviceHandleByIndex) X(nvmlDeviceIsMigDeviceHandle) \
    X(nvmlDeviceGetDeviceHandleFromMigDeviceHandle) X(nvmlDeviceGetGpuInstanceId) X(nvmlDeviceGetComputeInstanceId) \
    X(nvmlDeviceGetCudaComputeCapability) X(nvmlDeviceGetGpuFabricInfoV) X(nvmlDeviceGetP2PStatus)

#define AS_ENUM(n) F_##n,
#define AS_NAME(n) #n,
#define READING(fn, type, key, lo, hi) F_##fn,
enum {
    FUNCS(AS_ENUM)
#include "standin_readings.def"
    NFUNCS
};
#undef READING

/* The simple readings' state slots (sdev.reading), one per row of standin_readings.def. */
#define READING(fn, type, key, lo, hi) R_##fn,
enum {
#include "standin_readings.def"
    NREADINGS
};
#undef READING

/* nvmlDeviceGetFieldValues ids served from sdev.fv (standin.c FIELD_VALUES) */
#define FIELD_VALUE_COUNT 12
/* PCIe lanes whose NVML_FI_DEV_PCIE_COUNT_LANE_ERROR (scopeId = lane) the state can set: x16 is the widest link */
#define PCIE_MAX_LANES 16

/* P2P status lines the state can set (standin_fabric.c): peers by enumeration index, and the capabilities
 * nvmlGpuP2PCapsIndex_t names before UNKNOWN (read write nvlink atomics pci) */
#define P2P_MAX_PEERS 64
#define P2P_CAPS 5

/* NVLink per-link counters the state can set (standin_nvlink.c) */
#define NVLINK_COUNTERS 6

typedef struct {
    unsigned int pid;
    long long used; /* UNSET -> NVML_VALUE_NOT_AVAILABLE */
} sproc;

typedef struct {
    int n; /* -1: not supported */
    long long *v;
} slist;

typedef struct {
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
    char serial[NVML_DEVICE_SERIAL_BUFFER_SIZE];
    int has_serial;
    long long pci[5]; /* domain, bus, device, pciDeviceId, pciSubSystemId */
    long long mem[3]; /* total, reserved, used */
    long long util[2];
    long long temp;
    long long tthr[4]; /* shutdown, slowdown, mem_max, gpu_max = nvmlTemperatureThresholds_t 0..3 */
    long long reading[NREADINGS]; /* standin_readings.def, by R_ id; UNSET: NOT_SUPPORTED */
    long long pcons[2];
    long long cc[2]; /* nvmlDeviceGetCudaComputeCapability: major, minor */
    long long codec[2]; /* nvmlDeviceGetEncoderUtilization, nvmlDeviceGetDecoderUtilization: percent */
    long long fv[FIELD_VALUE_COUNT]; /* nvmlDeviceGetFieldValues, in FIELD_VALUES order (standin.c) */
    slist pcie_lanes;   /* NVML_FI_DEV_PCIE_COUNT_LANE_ERROR per lane (scopeId); n -1: not supported */
    long long margin;   /* nvmlDeviceGetMarginTemperature: degrees C to the nearest slowdown threshold */
    long long encstats[3]; /* nvmlDeviceGetEncoderStats: sessionCount, averageFps, averageLatency (us) */
    long long clk[4], maxclk[4]; /* nvmlClockType_t order: graphics, sm, mem, video */
    long long viol[NVML_PERF_POLICY_COUNT];
    long long pstate;
    slist fans, nvlink, rp[2];
    long long rp_pending;
    long long ecc_mode[2];
    long long ecc[4]; /* corrected volatile, uncorrected volatile, corrected aggregate, uncorrected aggregate */
    long long remap[4];
    long long pcie[8]; /* gen, max_gen, gpu_max_gen, width, max_width, tx_kbps, rx_kbps, replay */
    long long mig[2];
    long long evtypes;
    long long nvc[NVML_NVLINK_MAX_LINKS][NVLINK_COUNTERS]; /* standin_nvlink.c: per link tx rx crc_flit crc_data replay recovery */
    long long recovery_action; /* NVML_FI_DEV_GET_GPU_RECOVERY_ACTION */
    long long fabric[5]; /* standin_fabric.c: state status clique_id health_mask health_summary; state UNSET: none */
    unsigned char fabric_cluster[NVML_GPU_FABRIC_UUID_LEN];
    int p2p_set; /* any p2p line: nvmlDeviceGetP2PStatus answers */
    long long p2p[P2P_MAX_PEERS + 1][P2P_CAPS]; /* [0] the p2p_default line, [1 + peer index] a peer's */
    int nproc[2]; /* compute, graphics; -1: not supported */
    sproc *proc[2];
    slist putil; /* per-process utilization samples, 8 numbers each (standin_procutil.c); n -1: not supported */
    struct sgpm *gpm; /* standin_gpm.c: GPM activity; NULL = none in the state (isSupportedDevice 0) */
    int lost;
    int has_overrides;
    int err[NFUNCS], err_all;
    int delay[NFUNCS], delay_all; /* 0 none, >0 ms, -1 forever */
    /* MIG (standin_mig.c). On a GPU: mig_max slots (nvmlDeviceGetMaxMigDeviceCount while MIG is on) and its
     * instances. On a MIG instance's own sdev: its GPU / compute instance ids (UNSET on a GPU). */
    long long mig_max, gi, ci;
    int nmig, mig_open;
    struct smig *migs;
} sdev;

/* One MIG device (a compute instance) of a GPU: served through MIG device handles; `d` holds what calls on the
 * handle answer (uuid, name, memory, processes, overrides); everything left unset there answers NOT_SUPPORTED. */
typedef struct smig {
    sdev d;
    unsigned int index; /* nvmlDeviceGetMigDeviceHandleByIndex index under the GPU */
} smig;

/* A device handle: GPUs are standin.c's handles[slot]; MIG devices are standin_mig.c's, with slot = MIG index. */
struct nvmlDevice_st {
    int slot;
    unsigned long long gen; /* state generation didx was resolved against */
    int didx;               /* index into state->devs, -1 when the UUID is gone from the state */
};

typedef struct {
    unsigned long long seq, type, data;
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
} sevent;

typedef struct {
    char driver[NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE];
    char nvml[NVML_SYSTEM_NVML_VERSION_BUFFER_SIZE];
    long long cuda;
    int init_error;
    double clock;
    int ndev, cap_dev;
    sdev *devs;
    int nev, cap_ev;
    sevent *evs;
    unsigned long long max_seq;
} sstate;

extern const char *const func_names[NFUNCS];

/* standin_state.c: parse a whole state file from fd (NULL when truncated or malformed), and free one. */
sstate *parse_state(int fd);
void free_state(sstate *s);

/* standin.c: prologue and epilogue of every per-device call, shared with the other translation units
 * (standin_*.c). enter_dev returns with the state mutex held on NVML_SUCCESS; leave releases it. Not exported
 * (-fvisibility=hidden). */
nvmlReturn_t enter_dev(int fid, nvmlDevice_t h, int args_ok, sdev **out);
nvmlReturn_t leave(nvmlReturn_t r);
/* standin.c: lock the state mutex and refresh the state if NVML is initialized (0), else NVML_ERROR_UNINITIALIZED
 * with it unlocked. */
nvmlReturn_t enter_lib(void);
/* standin.c, with the mutex held: the current state's device with this UUID, or NULL when it left the state. */
sdev *state_dev(const char *uuid);

/* standin_gpm.c: parse a device's "gpm*" state line; free what it allocated. */
int parse_gpm_line(sdev *d, const char *key, char *args);
void free_gpm(sdev *d);

/* standin_nvlink.c: NVLink field values and the recovery action; its state lines and defaults. */
int nvlink_field_value(const sdev *d, nvmlFieldValue_t *v); /* 1: the id is NVLink's (v filled), 0: not its id */
int parse_nvlink_counters(sdev *d, char *a);
void nvlink_defaults(sdev *d);
int standin_parse_nums(char *s, long long *out, int max);

/* standin_fabric.c: fabric info and P2P status; their state lines and defaults. standin.c: a GPU handle's
 * enumeration slot (-1: not a GPU handle), without reloading the state. */
void fabric_defaults(sdev *d);
int parse_fabric_cluster(sdev *d, const char *a);
int parse_p2p(sdev *d, long long peer, const long long *st);
int peer_slot(nvmlDevice_t h);

/* standin_state.c: defaults of a device block, and one `key args` line of it (also used for MIG blocks). */
void dev_defaults(sdev *d);
int parse_device_line(sdev *d, const char *key, char *a);
void free_dev(sdev *d); /* what a device block allocated (its MIG devices' too) */
/* standin.c: entry i of an nvmlProcessInfo_v1_t / _v2_t array, with the owner's GPU / compute instance ids. */
void put_process(void *infos, unsigned int i, const sproc *p, const sdev *owner, int v1);

/* standin_mig.c: the MIG device handles. parse_mig_line takes the lines of `mig_device ... end_mig_device` blocks
 * inside a device block (1: consumed, 0: not a MIG line, -1: malformed); enter_mig is enter_dev's path for a MIG
 * handle (called with mu held); mig_processes fills a GPU's aggregate process list from its instances. */
int parse_mig_line(sdev *parent, const char *key, char *a);
void free_migs(sdev *d);
int is_mig_handle(nvmlDevice_t h);
nvmlReturn_t enter_mig(int fid, nvmlDevice_t h, int args_ok, sdev **out);
int mig_process_count(const sdev *gpu, int kind);
void mig_processes(const sdev *gpu, int kind, void *infos, int v1);

/* standin.c: with mu held, the state's GPU at enumeration slot (NULL when gone), its handle, and the slot count. */
sdev *gpu_at(int slot);
nvmlDevice_t gpu_handle(int slot);
int enum_count(void);

static inline void copy_str(char *dst, size_t cap, const char *src) { snprintf(dst, cap, "%s", src); }

#endif
