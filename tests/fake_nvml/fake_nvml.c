/*
 * A fake libnvidia-ml.so.1 for tests on machines without an NVIDIA GPU or driver.
 *
 * Built against the official nvml.h (pip package nvidia-nvml-dev) so every exported function has
 * the real signature and struct layout, and loaded by the real pynvml through LD_LIBRARY_PATH.
 * What the "driver" reports comes from the text file named by $FAKE_NVML_STATE, read again on
 * every call, so a test can change it while the program under test runs. See README.md beside
 * this file for the state-file format.
 *
 * Only the functions below exist: pynvml raises NVMLError_FunctionNotFound for any other, which
 * is how "a driver that lacks this call" is tested. -DFAKE_NVML_NO_V3 leaves out the _v3
 * process listings, as on a driver older than the 510 branch.
 */
#define _GNU_SOURCE
#define NVML_NO_UNVERSIONED_FUNC_DEFS /* declare nvmlInit, the _v2 process listings, ... as they are */
#include <nvml.h>

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_DEVICES 64
#define MAX_PROCESSES 4096
#define MAX_NAMED 128
#define MAX_XIDS 4096
#define MAX_LINE 4096
#define FN_LEN 128
#define BLOCK_POLL_MS 20
#define WAIT_POLL_MS 5

/* The event types a device says it supports; only Xid critical errors are ever delivered. */
#define SUPPORTED_EVENTS                                                                          \
    (nvmlEventTypeSingleBitEccError | nvmlEventTypeDoubleBitEccError | nvmlEventTypePState |      \
     nvmlEventTypeXidCriticalError | nvmlEventTypeClock)

enum kind { KIND_COMPUTE, KIND_GRAPHICS, KIND_MPS };

/* A device handle points at one of these; the table is static, so handles stay valid forever. */
struct nvmlDevice_st {
    int present;
    int lost;
    int has_memory;
    int has_utilization;
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    char bus_id[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE];
    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
    unsigned int domain, bus, slot;
    unsigned long long memory_total, memory_used;
    unsigned int utilization_gpu, utilization_memory;
};

struct process {
    unsigned int index;
    unsigned int pid;
    unsigned long long used;
    enum kind kind;
};

struct failure {
    char fn[FN_LEN];
    nvmlReturn_t code;
};

struct xid {
    unsigned int index;
    unsigned long long xid;
    unsigned long long seq;
};

struct delivered {
    unsigned int index;
    unsigned long long seq;
};

struct nvmlEventSet_st {
    struct nvmlEventSet_st *next; /* live sets, to tell a valid set from garbage */
    unsigned long long mask[MAX_DEVICES];
    struct delivered *delivered;
    size_t n_delivered, cap_delivered;
};

static struct nvmlDevice_st g_devices[MAX_DEVICES];

static struct {
    int valid; /* 0: the state file is malformed; every call returns NVML_ERROR_UNKNOWN */
    int missing;
    char driver_version[NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE];
    char nvml_version[NVML_SYSTEM_NVML_VERSION_BUFFER_SIZE];
    nvmlReturn_t init;
    unsigned int device_count;
    struct process processes[MAX_PROCESSES];
    unsigned int n_processes;
    char blocks[MAX_NAMED][FN_LEN];
    unsigned int n_blocks;
    struct failure failures[MAX_NAMED];
    unsigned int n_failures;
    struct xid xids[MAX_XIDS];
    unsigned int n_xids;
} g;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned int g_refcount;
static struct nvmlEventSet_st *g_sets;
static char g_last_problem[MAX_LINE + 256];

/* ---------------------------------------------------------------------------------------------- */
/* Reading the state file                                                                          */

static void problem(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Say what is wrong with the state file on stderr, once per distinct message. */
static void problem(const char *fmt, ...)
{
    char message[sizeof g_last_problem];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    if (strcmp(message, g_last_problem) != 0) {
        snprintf(g_last_problem, sizeof g_last_problem, "%s", message);
        fprintf(stderr, "fake_nvml: %s\n", message);
        fflush(stderr);
    }
}

static int parse_ull(const char *text, unsigned long long *out)
{
    char *end;
    if (text == NULL || *text == '\0' || *text == '-')
        return 0;
    errno = 0;
    *out = strtoull(text, &end, 10);
    return errno == 0 && *end == '\0';
}

static int parse_uint(const char *text, unsigned int *out)
{
    unsigned long long value;
    if (!parse_ull(text, &value) || value > 0xFFFFFFFFull)
        return 0;
    *out = (unsigned int)value;
    return 1;
}

static int parse_index(const char *text, unsigned int *out)
{
    return parse_uint(text, out) && *out < MAX_DEVICES;
}

static int copy_field(char *dst, size_t size, const char *src)
{
    if (src == NULL || strlen(src) >= size)
        return 0;
    strcpy(dst, src);
    return 1;
}

/* Split a line into at most max words on blanks; the last word takes the rest of the line. */
static int split(char *line, char **words, int max)
{
    int n = 0;
    char *p = line;
    while (n < max) {
        while (*p == ' ' || *p == '\t')
            p++;
        if (*p == '\0')
            break;
        words[n++] = p;
        if (n == max)
            break;
        while (*p != '\0' && *p != ' ' && *p != '\t')
            p++;
        if (*p == '\0')
            break;
        *p++ = '\0';
    }
    return n;
}

static void reset_state(void)
{
    memset(g_devices, 0, sizeof g_devices);
    g.valid = 1;
    g.missing = 0;
    snprintf(g.driver_version, sizeof g.driver_version, "%s", "550.54.15");
    g.nvml_version[0] = '\0';
    g.init = NVML_SUCCESS;
    g.device_count = 0;
    g.n_processes = g.n_blocks = g.n_failures = g.n_xids = 0;
}

#define BAD(...)                                                                                  \
    do {                                                                                          \
        problem(__VA_ARGS__);                                                                     \
        g.valid = 0;                                                                              \
        fclose(file);                                                                             \
        return;                                                                                   \
    } while (0)

/* Read $FAKE_NVML_STATE into g and g_devices. Called with g_lock held. */
static void load_state(void)
{
    const char *path = getenv("FAKE_NVML_STATE");
    char line[MAX_LINE + 2];
    unsigned int lineno = 0;
    FILE *file;

    reset_state();
    if (path == NULL || *path == '\0') {
        problem("FAKE_NVML_STATE is not set: acting as a machine without the NVIDIA driver");
        g.missing = 1;
        return;
    }
    file = fopen(path, "r");
    if (file == NULL) {
        problem("cannot read %s (%s): acting as a machine without the NVIDIA driver", path,
                strerror(errno));
        g.missing = 1;
        return;
    }
    while (fgets(line, sizeof line, file) != NULL) {
        char *words[6], *hash;
        int n;
        unsigned int index;
        size_t len = strlen(line);

        lineno++;
        if (len > 0 && line[len - 1] != '\n' && !feof(file))
            BAD("%s:%u: line longer than %d characters", path, lineno, MAX_LINE);
        if ((hash = strchr(line, '#')) != NULL)
            *hash = '\0';
        len = strlen(line);
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r' || line[len - 1] == ' ' ||
                           line[len - 1] == '\t'))
            line[--len] = '\0';

        n = split(line, words, 1);
        if (n == 0)
            continue;
        /* re-split with the right number of words for the directive */
        if (strncmp(words[0], "device", 6) == 0 && (words[0][6] == ' ' || words[0][6] == '\t'))
            n = split(line, words, 5);
        else
            n = split(line, words, 6);
        const char *d = words[0];

        if (strcmp(d, "driver_version") == 0) {
            if (n != 2 || !copy_field(g.driver_version, sizeof g.driver_version, words[1]))
                BAD("%s:%u: want: driver_version <version>", path, lineno);
        } else if (strcmp(d, "nvml_version") == 0) {
            if (n != 2 || !copy_field(g.nvml_version, sizeof g.nvml_version, words[1]))
                BAD("%s:%u: want: nvml_version <version>", path, lineno);
        } else if (strcmp(d, "init") == 0) {
            unsigned int code;
            if (n == 2 && strcmp(words[1], "ok") == 0)
                g.init = NVML_SUCCESS;
            else if (n == 2 && parse_uint(words[1], &code))
                g.init = (nvmlReturn_t)code;
            else
                BAD("%s:%u: want: init ok | init <return code>", path, lineno);
        } else if (strcmp(d, "device") == 0) {
            struct nvmlDevice_st *dev;
            unsigned int function;
            char tail;
            if (n != 5 || !parse_index(words[1], &index))
                BAD("%s:%u: want: device <index < %d> <uuid> <pci bus id> <name>", path, lineno,
                    MAX_DEVICES);
            dev = &g_devices[index];
            if (dev->present)
                BAD("%s:%u: device %u declared twice", path, lineno, index);
            if (!copy_field(dev->uuid, sizeof dev->uuid, words[2]) ||
                !copy_field(dev->bus_id, sizeof dev->bus_id, words[3]) ||
                !copy_field(dev->name, sizeof dev->name, words[4]))
                BAD("%s:%u: device field too long", path, lineno);
            if (sscanf(dev->bus_id, "%x:%x:%x.%x%c", &dev->domain, &dev->bus, &dev->slot, &function,
                       &tail) != 4)
                BAD("%s:%u: PCI bus id %s is not domain:bus:device.function in hex", path, lineno,
                    dev->bus_id);
            dev->present = 1;
        } else if (strcmp(d, "memory") == 0) {
            unsigned long long total, used;
            if (n != 4 || !parse_index(words[1], &index) || !parse_ull(words[2], &total) ||
                !parse_ull(words[3], &used) || used > total)
                BAD("%s:%u: want: memory <index> <total bytes> <used bytes <= total>", path, lineno);
            g_devices[index].has_memory = 1;
            g_devices[index].memory_total = total;
            g_devices[index].memory_used = used;
        } else if (strcmp(d, "utilization") == 0) {
            unsigned int gpu, memory;
            if (n != 4 || !parse_index(words[1], &index) || !parse_uint(words[2], &gpu) ||
                !parse_uint(words[3], &memory) || gpu > 100 || memory > 100)
                BAD("%s:%u: want: utilization <index> <gpu %%> <memory %%>", path, lineno);
            g_devices[index].has_utilization = 1;
            g_devices[index].utilization_gpu = gpu;
            g_devices[index].utilization_memory = memory;
        } else if (strcmp(d, "process") == 0) {
            struct process *p = &g.processes[g.n_processes];
            if (g.n_processes == MAX_PROCESSES)
                BAD("%s:%u: more than %d processes", path, lineno, MAX_PROCESSES);
            if (n != 5 || !parse_index(words[1], &p->index) || !parse_uint(words[2], &p->pid))
                BAD("%s:%u: want: process <index> <pid> <used bytes|na> <compute|graphics|mps>", path,
                    lineno);
            if (strcmp(words[3], "na") == 0)
                p->used = (unsigned long long)NVML_VALUE_NOT_AVAILABLE;
            else if (!parse_ull(words[3], &p->used))
                BAD("%s:%u: process memory must be bytes or na", path, lineno);
            if (strcmp(words[4], "compute") == 0)
                p->kind = KIND_COMPUTE;
            else if (strcmp(words[4], "graphics") == 0)
                p->kind = KIND_GRAPHICS;
            else if (strcmp(words[4], "mps") == 0)
                p->kind = KIND_MPS;
            else
                BAD("%s:%u: process kind must be compute, graphics or mps", path, lineno);
            g.n_processes++;
        } else if (strcmp(d, "lost") == 0) {
            if (n != 2 || !parse_index(words[1], &index))
                BAD("%s:%u: want: lost <index>", path, lineno);
            g_devices[index].lost = 1;
        } else if (strcmp(d, "block") == 0) {
            if (g.n_blocks == MAX_NAMED)
                BAD("%s:%u: more than %d block lines", path, lineno, MAX_NAMED);
            if (n != 2 || !copy_field(g.blocks[g.n_blocks], FN_LEN, words[1]))
                BAD("%s:%u: want: block <nvml function name>", path, lineno);
            g.n_blocks++;
        } else if (strcmp(d, "fail") == 0) {
            struct failure *f = &g.failures[g.n_failures];
            unsigned int code;
            if (g.n_failures == MAX_NAMED)
                BAD("%s:%u: more than %d fail lines", path, lineno, MAX_NAMED);
            if (n != 3 || !copy_field(f->fn, FN_LEN, words[1]) || !parse_uint(words[2], &code) ||
                code == NVML_SUCCESS)
                BAD("%s:%u: want: fail <nvml function name> <non-zero return code>", path, lineno);
            f->code = (nvmlReturn_t)code;
            g.n_failures++;
        } else if (strcmp(d, "xid") == 0) {
            struct xid *x = &g.xids[g.n_xids];
            if (g.n_xids == MAX_XIDS)
                BAD("%s:%u: more than %d xid lines", path, lineno, MAX_XIDS);
            if (n != 4 || !parse_index(words[1], &x->index) || !parse_ull(words[2], &x->xid) ||
                !parse_ull(words[3], &x->seq))
                BAD("%s:%u: want: xid <index> <xid> <sequence number>", path, lineno);
            g.n_xids++;
        } else {
            BAD("%s:%u: unknown directive %s", path, lineno, d);
        }
    }
    if (ferror(file))
        BAD("error reading %s", path);
    fclose(file);

    /* Devices are numbered 0..n-1 as NVML numbers them; everything else names a declared device. */
    while (g.device_count < MAX_DEVICES && g_devices[g.device_count].present)
        g.device_count++;
    for (unsigned int i = g.device_count; i < MAX_DEVICES; i++) {
        struct nvmlDevice_st *dev = &g_devices[i];
        if (dev->present || dev->lost || dev->has_memory || dev->has_utilization) {
            problem("%s: device %u is %s, but devices must be declared as 0..n-1 (there are %u)",
                    path, i, dev->present ? "declared" : "used and not declared", g.device_count);
            g.valid = 0;
            return;
        }
    }
    for (unsigned int i = 0; i < g.n_processes; i++)
        if (g.processes[i].index >= g.device_count) {
            problem("%s: a process is on device %u, which is not declared", path, g.processes[i].index);
            g.valid = 0;
            return;
        }
    for (unsigned int i = 0; i < g.n_xids; i++)
        if (g.xids[i].index >= g.device_count) {
            problem("%s: an xid is on device %u, which is not declared", path, g.xids[i].index);
            g.valid = 0;
            return;
        }
    if (g.nvml_version[0] == '\0') {
        /* As the real one: the CUDA major version the driver branch goes with, then the driver's */
        unsigned long branch = strtoul(g.driver_version, NULL, 10);
        snprintf(g.nvml_version, sizeof g.nvml_version, "%d.%.60s",
                 branch >= 580 ? 13 : branch >= 525 ? 12 : 11, g.driver_version);
    }
    g_last_problem[0] = '\0'; /* a later problem is news again */
}

/* ---------------------------------------------------------------------------------------------- */
/* Call prologue: block, malformed state, initialisation, injected failure                         */

static void sleep_ms(unsigned int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

static unsigned long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (unsigned long long)ts.tv_sec * 1000ull + (unsigned long long)ts.tv_nsec / 1000000ull;
}

static int blocked(const char *fn)
{
    for (unsigned int i = 0; i < g.n_blocks; i++)
        if (strcmp(g.blocks[i], fn) == 0)
            return 1;
    return 0;
}

/*
 * Every call starts here. Waits (without holding the lock, so other threads' calls go on) while
 * the state file says `block fn`, then takes the lock and reads the state. Returns with the lock
 * held; the caller returns through leave().
 */
static nvmlReturn_t enter(const char *fn, int needs_init)
{
    for (;;) {
        pthread_mutex_lock(&g_lock);
        load_state();
        if (!blocked(fn))
            break;
        pthread_mutex_unlock(&g_lock);
        sleep_ms(BLOCK_POLL_MS);
    }
    if (!g.valid)
        return NVML_ERROR_UNKNOWN;
    if (needs_init && g_refcount == 0)
        return NVML_ERROR_UNINITIALIZED;
    for (unsigned int i = 0; i < g.n_failures; i++)
        if (strcmp(g.failures[i].fn, fn) == 0)
            return g.failures[i].code;
    return NVML_SUCCESS;
}

static nvmlReturn_t leave(nvmlReturn_t rc)
{
    pthread_mutex_unlock(&g_lock);
    return rc;
}

#define ENTER(fn, needs_init)                                                                     \
    do {                                                                                          \
        nvmlReturn_t entered_ = enter((fn), (needs_init));                                        \
        if (entered_ != NVML_SUCCESS)                                                             \
            return leave(entered_);                                                               \
    } while (0)

/* A handle from nvmlDeviceGetHandleByIndex_v2 of a device that is (still) in the state file. */
static nvmlReturn_t check_device(nvmlDevice_t device, unsigned int *index)
{
    uintptr_t base = (uintptr_t)g_devices, at = (uintptr_t)device;
    if (device == NULL || at < base || at >= base + sizeof g_devices ||
        (at - base) % sizeof g_devices[0] != 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    *index = (unsigned int)((at - base) / sizeof g_devices[0]);
    if (!device->present)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (device->lost)
        return NVML_ERROR_GPU_IS_LOST;
    return NVML_SUCCESS;
}

#define DEVICE(device, index)                                                                     \
    do {                                                                                          \
        nvmlReturn_t checked_ = check_device((device), &(index));                                 \
        if (checked_ != NVML_SUCCESS)                                                             \
            return leave(checked_);                                                               \
    } while (0)

static nvmlReturn_t copy_out(char *dst, unsigned int length, const char *src)
{
    if (dst == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(src) + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, strlen(src) + 1);
    return NVML_SUCCESS;
}

/* ---------------------------------------------------------------------------------------------- */
/* Initialisation                                                                                  */

static nvmlReturn_t do_init(const char *fn)
{
    ENTER(fn, 0);
    if (g.missing)
        return leave(NVML_ERROR_DRIVER_NOT_LOADED);
    if (g.init != NVML_SUCCESS)
        return leave(g.init);
    g_refcount++;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlInit_v2(void)
{
    return do_init(__func__);
}

nvmlReturn_t nvmlInit(void)
{
    return do_init(__func__);
}

nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;
    return do_init(__func__);
}

nvmlReturn_t nvmlShutdown(void)
{
    ENTER(__func__, 1);
    g_refcount--;
    return leave(NVML_SUCCESS);
}

const char *nvmlErrorString(nvmlReturn_t result)
{
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
    case NVML_ERROR_INSUFFICIENT_RESOURCES: return "Insufficient resources";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    case NVML_ERROR_NOT_READY: return "Not ready";
    case NVML_ERROR_GPU_NOT_FOUND: return "GPU not found";
    case NVML_ERROR_INVALID_STATE: return "Invalid state";
    default: return "Unknown Error";
    }
}

/* ---------------------------------------------------------------------------------------------- */
/* System                                                                                          */

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    ENTER(__func__, 1);
    return leave(copy_out(version, length, g.driver_version));
}

nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    ENTER(__func__, 1);
    return leave(copy_out(version, length, g.nvml_version));
}

/* ---------------------------------------------------------------------------------------------- */
/* Devices                                                                                         */

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount)
{
    ENTER(__func__, 1);
    if (deviceCount == NULL)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    *deviceCount = g.device_count;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    ENTER(__func__, 1);
    if (device == NULL || index >= g.device_count)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    /* As the real driver: nvidia-smi's "Unable to determine the device handle for GPU...: GPU is lost" */
    if (g_devices[index].lost)
        return leave(NVML_ERROR_GPU_IS_LOST);
    *device = &g_devices[index];
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    unsigned int index;
    ENTER(__func__, 1);
    DEVICE(device, index);
    return leave(copy_out(uuid, length, g_devices[index].uuid));
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    unsigned int index;
    ENTER(__func__, 1);
    DEVICE(device, index);
    return leave(copy_out(name, length, g_devices[index].name));
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    unsigned int index;
    struct nvmlDevice_st *dev;
    ENTER(__func__, 1);
    DEVICE(device, index);
    if (pci == NULL)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    dev = &g_devices[index];
    memset(pci, 0, sizeof *pci);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, NVML_DEVICE_PCI_BUS_ID_LEGACY_FMT,
             dev->domain & 0xFFFFu, dev->bus & 0xFFu, dev->slot & 0xFFu);
    snprintf(pci->busId, sizeof pci->busId, "%s", dev->bus_id);
    pci->domain = dev->domain;
    pci->bus = dev->bus;
    pci->device = dev->slot;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    unsigned int index;
    struct nvmlDevice_st *dev;
    ENTER(__func__, 1);
    DEVICE(device, index);
    dev = &g_devices[index];
    if (memory == NULL)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (!dev->has_memory)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    memory->total = dev->memory_total;
    memory->used = dev->memory_used;
    memory->free = dev->memory_total - dev->memory_used;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization)
{
    unsigned int index;
    struct nvmlDevice_st *dev;
    ENTER(__func__, 1);
    DEVICE(device, index);
    dev = &g_devices[index];
    if (utilization == NULL)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (!dev->has_utilization)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    utilization->gpu = dev->utilization_gpu;
    utilization->memory = dev->utilization_memory;
    return leave(NVML_SUCCESS);
}

/* ---------------------------------------------------------------------------------------------- */
/* Running processes: the count / NVML_ERROR_INSUFFICIENT_SIZE protocol                            */

/*
 * *infoCount in: room in infos. Fewer than the processes (a first call with 0 and NULL to size
 * the array): *infoCount = how many, NVML_ERROR_INSUFFICIENT_SIZE, or NVML_SUCCESS when there are
 * none. Enough: the processes are written and *infoCount = how many.
 * nvmlProcessInfo_v2_t and nvmlProcessInfo_t (v3) have the same layout in nvml.h.
 */
static nvmlReturn_t list_processes(const char *fn, nvmlDevice_t device, unsigned int *infoCount,
                                   nvmlProcessInfo_v2_t *infos, enum kind kind)
{
    unsigned int index, n = 0, j = 0;
    ENTER(fn, 1);
    DEVICE(device, index);
    if (infoCount == NULL)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    for (unsigned int i = 0; i < g.n_processes; i++)
        if (g.processes[i].index == index && g.processes[i].kind == kind)
            n++;
    if (*infoCount < n) {
        *infoCount = n;
        return leave(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    if (n > 0 && infos == NULL)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    for (unsigned int i = 0; i < g.n_processes; i++) {
        const struct process *p = &g.processes[i];
        if (p->index != index || p->kind != kind)
            continue;
        infos[j].pid = p->pid;
        infos[j].usedGpuMemory = p->used;
        infos[j].gpuInstanceId = 0xFFFFFFFFu; /* not MIG */
        infos[j].computeInstanceId = 0xFFFFFFFFu;
        j++;
    }
    *infoCount = n;
    return leave(NVML_SUCCESS);
}

#ifndef FAKE_NVML_NO_V3
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                     nvmlProcessInfo_t *infos)
{
    return list_processes(__func__, device, infoCount, infos, KIND_COMPUTE);
}

nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                      nvmlProcessInfo_t *infos)
{
    return list_processes(__func__, device, infoCount, infos, KIND_GRAPHICS);
}

nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                        nvmlProcessInfo_t *infos)
{
    return list_processes(__func__, device, infoCount, infos, KIND_MPS);
}
#endif

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
                                                     nvmlProcessInfo_v2_t *infos)
{
    return list_processes(__func__, device, infoCount, infos, KIND_COMPUTE);
}

nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
                                                      nvmlProcessInfo_v2_t *infos)
{
    return list_processes(__func__, device, infoCount, infos, KIND_GRAPHICS);
}

nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
                                                        nvmlProcessInfo_v2_t *infos)
{
    return list_processes(__func__, device, infoCount, infos, KIND_MPS);
}

/* ---------------------------------------------------------------------------------------------- */
/* Events: Xid critical errors from `xid` lines, each (device, sequence number) once per set       */

static int live_set(nvmlEventSet_t set)
{
    for (struct nvmlEventSet_st *s = g_sets; s != NULL; s = s->next)
        if (s == set)
            return 1;
    return 0;
}

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set)
{
    struct nvmlEventSet_st *s;
    ENTER(__func__, 1);
    if (set == NULL)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    s = calloc(1, sizeof *s);
    if (s == NULL)
        return leave(NVML_ERROR_MEMORY);
    s->next = g_sets;
    g_sets = s;
    *set = s;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *eventTypes)
{
    unsigned int index;
    ENTER(__func__, 1);
    DEVICE(device, index);
    if (eventTypes == NULL)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    *eventTypes = SUPPORTED_EVENTS;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes,
                                      nvmlEventSet_t set)
{
    unsigned int index;
    ENTER(__func__, 1);
    DEVICE(device, index);
    if (!live_set(set))
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (eventTypes & ~(unsigned long long)SUPPORTED_EVENTS)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    set->mask[index] |= eventTypes;
    return leave(NVML_SUCCESS);
}

static int was_delivered(const struct nvmlEventSet_st *set, unsigned int index, unsigned long long seq)
{
    for (size_t i = 0; i < set->n_delivered; i++)
        if (set->delivered[i].index == index && set->delivered[i].seq == seq)
            return 1;
    return 0;
}

nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms)
{
    unsigned long long deadline = now_ms() + timeoutms;
    for (;;) {
        unsigned long long now;
        ENTER(__func__, 1);
        if (!live_set(set) || data == NULL)
            return leave(NVML_ERROR_INVALID_ARGUMENT);
        for (unsigned int i = 0; i < g.n_xids; i++) {
            const struct xid *x = &g.xids[i];
            if (!(set->mask[x->index] & nvmlEventTypeXidCriticalError) ||
                was_delivered(set, x->index, x->seq))
                continue;
            if (set->n_delivered == set->cap_delivered) {
                size_t cap = set->cap_delivered ? set->cap_delivered * 2 : 16;
                struct delivered *grown = realloc(set->delivered, cap * sizeof *grown);
                if (grown == NULL)
                    return leave(NVML_ERROR_MEMORY);
                set->delivered = grown;
                set->cap_delivered = cap;
            }
            set->delivered[set->n_delivered].index = x->index;
            set->delivered[set->n_delivered].seq = x->seq;
            set->n_delivered++;
            memset(data, 0, sizeof *data);
            data->device = &g_devices[x->index];
            data->eventType = nvmlEventTypeXidCriticalError;
            data->eventData = x->xid;
            data->gpuInstanceId = 0xFFFFFFFFu;
            data->computeInstanceId = 0xFFFFFFFFu;
            return leave(NVML_SUCCESS);
        }
        leave(NVML_SUCCESS);
        now = now_ms();
        if (now >= deadline)
            return NVML_ERROR_TIMEOUT;
        sleep_ms(deadline - now < WAIT_POLL_MS ? (unsigned int)(deadline - now) : WAIT_POLL_MS);
    }
}

nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set)
{
    struct nvmlEventSet_st **link;
    ENTER(__func__, 1);
    for (link = &g_sets; *link != NULL; link = &(*link)->next)
        if (*link == set) {
            *link = set->next;
            free(set->delivered);
            free(set);
            return leave(NVML_SUCCESS);
        }
    return leave(NVML_ERROR_INVALID_ARGUMENT);
}
