/* A simulated libefml for the simulated node: the vendor library's symbols and struct layouts
 * (efml_types.h), with every value read from the files the simulator writes under the node's root:
 *   <root>/.enflame-sim/efml/node      "driver_ver X", "lib_ver X", "init_fail CODE"
 *   <root>/.enflame-sim/efml/card<I>   one "key value" line per reading of card index I
 * A card file may also say "fail CODE" (every call on the card returns CODE), "hang 1" (every
 * call blocks until the line goes away: a hung card), "unsupported Name Name" (those functions
 * return NOT_SUPPORTED) or "refuse Name=CODE Name=CODE" (those functions return CODE). A new
 * "driver_ver" in the node file is a driver reload: every call but EfmlGetDriverVer answers
 * UNINITIALIZED until EfmlInit runs again. "event_seq N" with "event_id", "event_type" and
 * "event_msg" in the node file is the next event EfmlGetEvent hands out (once per new N).
 * The library counts the calls inside it: EfmlInit or EfmlShutdown entered while another call is
 * inside (which a real libefml does not survive) appends a line to <root>/.enflame-sim/efml/
 * overlaps. The root is where the library sits: <root>/usr/lib/libefml.so, or
 * $EFML_SIM_ROOT when it is loaded from anywhere else (installed as the vendor installs it, under
 * <root>/usr/local/efsmi/lib and linked from <root>/usr/lib, it finds the root from its
 * resolved path). Built by enflame_gcu.simulation.efmlsim
 * with the system compiler; -DEFML_SIM_LEGACY leaves out the optional and GCU300-only calls, as
 * an older library would. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "efml_types.h"

#define EXPORT __attribute__((visibility("default")))
#define BUF 128
#define FILE_MAX 8192
#define HANG_LIMIT_MS 600000

static char g_root[4096];
static int g_initialized;
static char g_driver[BUF];   /* the node's driver_ver when EfmlInit ran */
static long g_event_seq;     /* the last event handed out */
static int g_inside;         /* calls inside the library now (atomic) */

static void leave(int *unused) {
    (void)unused;
    __atomic_sub_fetch(&g_inside, 1, __ATOMIC_SEQ_CST);
}
/* Counts the calling function as inside the library until it returns. */
#define INSIDE                                                                              \
    int inside_ __attribute__((cleanup(leave))) =                                           \
        __atomic_add_fetch(&g_inside, 1, __ATOMIC_SEQ_CST);                                 \
    (void)inside_

static void find_root(void) {
    const char *env = getenv("EFML_SIM_ROOT");
    Dl_info info;
    const char *suffix = "/usr/lib/libefml.so";
    g_root[0] = '\0';
    if (dladdr((void *)find_root, &info) && info.dli_fname) {
        size_t n = strlen(info.dli_fname), s = strlen(suffix);
        if (n > s && strcmp(info.dli_fname + n - s, suffix) == 0 && n - s < sizeof g_root) {
            memcpy(g_root, info.dli_fname, n - s);
            g_root[n - s] = '\0';
            return;
        }
        const char *vendor = strstr(info.dli_fname, "/usr/local/efsmi/lib/");
        if (vendor && (size_t)(vendor - info.dli_fname) < sizeof g_root) {
            memcpy(g_root, info.dli_fname, (size_t)(vendor - info.dli_fname));
            g_root[vendor - info.dli_fname] = '\0';
            return;
        }
    }
    if (env && strlen(env) < sizeof g_root) strcpy(g_root, env);
}

/* The whole values file of "card<I>" or "node" into buf; 0 when it exists. */
static int read_file(const char *name, char *buf) {
    char path[4352];
    snprintf(path, sizeof path, "%s/.enflame-sim/efml/%s", g_root, name);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    size_t n = fread(buf, 1, FILE_MAX - 1, f);
    fclose(f);
    buf[n] = '\0';
    return 0;
}

/* The value of "key value" in text, copied to out (at most len-1 bytes); 0 when found. */
static int lookup(const char *text, const char *key, char *out, size_t len) {
    size_t k = strlen(key);
    const char *line = text;
    while (line && *line) {
        if (strncmp(line, key, k) == 0 && line[k] == ' ') {
            const char *v = line + k + 1, *end = strchr(v, '\n');
            size_t n = end ? (size_t)(end - v) : strlen(v);
            if (n >= len) n = len - 1;
            memcpy(out, v, n);
            out[n] = '\0';
            return 0;
        }
        line = strchr(line, '\n');
        if (line) line++;
    }
    return -1;
}

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {}
}

static int card_count(void) {
    char buf[FILE_MAX], name[32];
    int n = 0;
    while (n < 128) {
        snprintf(name, sizeof name, "card%d", n);
        if (read_file(name, buf) != 0) break;
        n++;
    }
    return n;
}

/* Whether the driver was reloaded (its version changed) since EfmlInit. */
static int reloaded(void) {
    char text[FILE_MAX], value[BUF];
    if (read_file("node", text) != 0) return 1;
    if (lookup(text, "driver_ver", value, sizeof value) != 0) value[0] = '\0';
    return strcmp(value, g_driver) != 0;
}

/* Every per-card call starts here: initialised, a known card, and the card's injected faults. */
static efmlReturn_t enter(uint32_t idx, const char *fn, char *text) {
    char name[32], value[BUF];
    if (!g_initialized || reloaded()) return EFML_ERROR_UNINITIALIZED;
    snprintf(name, sizeof name, "card%u", idx);
    if (read_file(name, text) != 0) return EFML_ERROR_INVALID_ARGUMENT;
    for (long waited = 0; lookup(text, "hang", value, sizeof value) == 0; waited += 20) {
        if (waited >= HANG_LIMIT_MS) return EFML_ERROR_TIMEOUT;
        sleep_ms(20);
        if (read_file(name, text) != 0) return EFML_ERROR_INVALID_ARGUMENT;
    }
    if (lookup(text, "fail", value, sizeof value) == 0) return (efmlReturn_t)atoi(value);
    if (lookup(text, "refuse", value, sizeof value) == 0) {
        char *tok, *save = NULL;
        size_t n = strlen(fn);
        for (tok = strtok_r(value, " ", &save); tok; tok = strtok_r(NULL, " ", &save))
            if (strncmp(tok, fn, n) == 0 && tok[n] == '=') return (efmlReturn_t)atoi(tok + n + 1);
    }
    if (lookup(text, "unsupported", value, sizeof value) == 0) {
        char *tok, *save = NULL;
        for (tok = strtok_r(value, " ", &save); tok; tok = strtok_r(NULL, " ", &save))
            if (strcmp(tok, fn) == 0) return EFML_ERROR_NOT_SUPPORTED;
    }
    return EFML_SUCCESS;
}

static efmlReturn_t get_str(const char *text, const char *key, char *out) {
    if (!out) return EFML_ERROR_INVALID_ARGUMENT;
    if (lookup(text, key, out, BUF) != 0) return EFML_ERROR_NOT_SUPPORTED;
    return EFML_SUCCESS;
}

static double num(const char *text, const char *key, double fallback) {
    char value[BUF];
    return lookup(text, key, value, sizeof value) == 0 ? strtod(value, NULL) : fallback;
}

static int has(const char *text, const char *key) {
    char value[BUF];
    return lookup(text, key, value, sizeof value) == 0;
}

/* The n-th number of a space-separated list value; -1 when missing. */
static double nth(const char *text, const char *key, uint32_t n) {
    char value[1024], *tok, *save = NULL; /* room for 128 vGCU indexes */
    uint32_t i = 0;
    if (lookup(text, key, value, sizeof value) != 0) return -1;
    for (tok = strtok_r(value, " ", &save); tok; tok = strtok_r(NULL, " ", &save), i++)
        if (i == n) return strtod(tok, NULL);
    return -1;
}

#define CARD_CALL(fn, idx)                          \
    INSIDE;                                         \
    char text[FILE_MAX];                            \
    efmlReturn_t rc = enter((idx), fn, text);       \
    if (rc != EFML_SUCCESS) return rc

#ifdef EFML_SIM_DEP
int efsmi_sim_dep_ready(void); /* efsmi_dep.c, a separate library next to this one */
#endif

/* EfmlInit/EfmlShutdown found other calls inside: say so where the tests look. */
static void overlap(const char *fn) {
    int others = __atomic_load_n(&g_inside, __ATOMIC_SEQ_CST);
    char path[4352];
    if (others <= 0) return;
    snprintf(path, sizeof path, "%s/.enflame-sim/efml/overlaps", g_root);
    FILE *f = fopen(path, "a");
    if (!f) return;
    fprintf(f, "%s with %d call(s) inside\n", fn, others);
    fclose(f);
}

EXPORT efmlReturn_t EfmlInit(bool no_driver) {
    char text[FILE_MAX], value[BUF];
    (void)no_driver;
    if (g_root[0]) overlap("EfmlInit"); /* a re-init: the root is known */
#ifdef EFML_SIM_DEP
    if (!efsmi_sim_dep_ready()) return EFML_ERROR_LIBRARY_NOT_FOUND;
#endif
    find_root();
    if (read_file("node", text) != 0) return EFML_ERROR_DRIVER_NOT_LOADED;
    if (lookup(text, "init_fail", value, sizeof value) == 0) return (efmlReturn_t)atoi(value);
    if (lookup(text, "driver_ver", g_driver, sizeof g_driver) != 0) g_driver[0] = '\0';
    g_event_seq = (long)num(text, "event_seq", 0);
    g_initialized = 1;
    return EFML_SUCCESS;
}

EXPORT void EfmlShutdown(void) {
    overlap("EfmlShutdown");
    g_initialized = 0;
}

EXPORT efmlReturn_t EfmlErrorString(efmlReturn_t code, char *out) {
    static const char *names[] = {"Success", "Uninitialized", "Invalid argument", "Not supported",
        "Library not found", "Invalid error code", "Driver not loaded", "GCU-LARE port number error",
        "Invalid input", "Function not found", "Open driver version failed",
        "Driver not compatible", "No device", "Deprecated"};
    if (!out) return EFML_ERROR_INVALID_ARGUMENT;
    if ((int)code >= 0 && (int)code < 14) snprintf(out, BUF, "%s", names[code]);
    else if (code == EFML_ERROR_TIMEOUT) snprintf(out, BUF, "Timeout");
    else if (code == EFML_ERROR_FAIL) snprintf(out, BUF, "Fail");
    else return EFML_ERROR_INVALID_ERROR_CODE;
    return EFML_SUCCESS;
}

static efmlReturn_t node_str(const char *key, char *out) {
    INSIDE;
    char text[FILE_MAX];
    if (!g_initialized) return EFML_ERROR_UNINITIALIZED;
    if (read_file("node", text) != 0) return EFML_ERROR_DRIVER_NOT_LOADED;
    return get_str(text, key, out);
}

EXPORT efmlReturn_t EfmlGetDriverVer(char *out) { return node_str("driver_ver", out); }
EXPORT efmlReturn_t EfmlGetLibVer(char *out) { return node_str("lib_ver", out); }
EXPORT efmlReturn_t EfmlGetDriverAccessPoint(char *out) { return node_str("access_point", out); }

EXPORT efmlReturn_t EfmlGetDevCount(uint32_t *count) {
    INSIDE;
    char text[FILE_MAX], value[BUF];
    if (!g_initialized || reloaded()) return EFML_ERROR_UNINITIALIZED;
    if (!count) return EFML_ERROR_INVALID_ARGUMENT;
    if (read_file("node", text) == 0 && lookup(text, "count_fail", value, sizeof value) == 0)
        return (efmlReturn_t)atoi(value);
    *count = (uint32_t)card_count();
    return EFML_SUCCESS;
}

#define STRING_GETTER(fn, key)                          \
    EXPORT efmlReturn_t fn(uint32_t idx, char *out) {   \
        CARD_CALL(#fn, idx);                            \
        return get_str(text, key, out);                 \
    }
STRING_GETTER(EfmlGetDevName, "name")
STRING_GETTER(EfmlGetDevUuid, "uuid")
STRING_GETTER(EfmlGetDevSn, "sn")
STRING_GETTER(EfmlGetDevPn, "pn")
STRING_GETTER(EfmlGetDevSKU, "sku")
STRING_GETTER(EfmlGetFwVersion, "fw_version")
STRING_GETTER(EfmlGetDevSlotOamName, "slot")

EXPORT efmlReturn_t EfmlGetDevInfo(uint32_t idx, efmlDeviceInfo_t *info) {
    CARD_CALL("EfmlGetDevInfo", idx);
    if (!info) return EFML_ERROR_INVALID_ARGUMENT;
    memset(info, 0, sizeof *info);
    lookup(text, "name", info->name, sizeof info->name);
    info->vendor_id = (uint32_t)num(text, "vendor_id", 0x1e36);
    info->device_id = (uint32_t)num(text, "device_id", 0);
    info->domain_id = (uint32_t)num(text, "domain", 0);
    info->bus_id = (uint32_t)num(text, "bus", 0);
    info->dev_id = (uint32_t)num(text, "dev", 0);
    info->func_id = (uint32_t)num(text, "func", 0);
    info->logic_id = (uint32_t)num(text, "logic_id", idx);
    return EFML_SUCCESS;
}

EXPORT efmlReturn_t EfmlGetDevMem(uint32_t idx, efmlDevMemInfo_t *mem) {
    CARD_CALL("EfmlGetDevMem", idx);
    if (!mem) return EFML_ERROR_INVALID_ARGUMENT;
    mem->mem_total_size = (uint64_t)num(text, "mem_total_bytes", 0);
    mem->mem_used = (uint32_t)num(text, "mem_used_mib", 0);
    return EFML_SUCCESS;
}

EXPORT efmlReturn_t EfmlGetDevDtuUsageAsync(uint32_t idx, float *usage) {
    CARD_CALL("EfmlGetDevDtuUsageAsync", idx);
    if (!usage) return EFML_ERROR_INVALID_ARGUMENT;
    *usage = (float)num(text, "usage", 0);
    return EFML_SUCCESS;
}

EXPORT efmlReturn_t EfmlGetDevDtuUsage(uint32_t idx, float *usage) {
    CARD_CALL("EfmlGetDevDtuUsage", idx);
    if (!usage) return EFML_ERROR_INVALID_ARGUMENT;
    *usage = (float)num(text, "usage", 0);
    return EFML_SUCCESS;
}

EXPORT efmlReturn_t EfmlGetClusterCount(uint32_t idx, uint32_t *count) {
    CARD_CALL("EfmlGetClusterCount", idx);
    if (!count) return EFML_ERROR_INVALID_ARGUMENT;
    *count = (uint32_t)num(text, "clusters", 0);
    return EFML_SUCCESS;
}

EXPORT efmlReturn_t EfmlGetDevClusterUsage(uint32_t idx, uint32_t cluster, float *usage) {
    CARD_CALL("EfmlGetDevClusterUsage", idx);
    if (!usage || cluster >= (uint32_t)num(text, "clusters", 0)) return EFML_ERROR_INVALID_ARGUMENT;
    *usage = (float)nth(text, "cluster_usage", cluster);
    return EFML_SUCCESS;
}

EXPORT efmlReturn_t EfmlGetPGCount(uint32_t idx, uint32_t *count) {
    CARD_CALL("EfmlGetPGCount", idx);
    if (!count) return EFML_ERROR_INVALID_ARGUMENT;
    *count = (uint32_t)num(text, "pgs", 0);
    return EFML_SUCCESS;
}

EXPORT efmlReturn_t EfmlGetDevPGUsageAsync(uint32_t idx, uint32_t pg, float *usage) {
    CARD_CALL("EfmlGetDevPGUsageAsync", idx);
    if (!usage || pg >= (uint32_t)num(text, "pgs", 0)) return EFML_ERROR_INVALID_ARGUMENT;
    *usage = (float)nth(text, "pg_usage", pg);
    return EFML_SUCCESS;
}

EXPORT efmlReturn_t EfmlGetDevClk(uint32_t idx, efmlDevClkInfo_t *clk) {
    CARD_CALL("EfmlGetDevClk", idx);
    if (!clk) return EFML_ERROR_INVALID_ARGUMENT;
    clk->cur_hbm_clock = (uint32_t)num(text, "hbm_clock_mhz", 0);
    clk->cur_dtu_clock = (uint32_t)num(text, "dtu_clock_mhz", 0);
    return EFML_SUCCESS;
}

EXPORT efmlReturn_t EfmlGetDevTemp(uint32_t idx, efmlDevThermalInfo_t *t) {
    CARD_CALL("EfmlGetDevTemp", idx);
    if (!t) return EFML_ERROR_INVALID_ARGUMENT;
    t->cur_dev_temp = (float)num(text, "asic_temp", 0);
    t->cur_hbm0_temp = (float)num(text, "mem_temp", 0);
    t->cur_hbm1_temp = (float)num(text, "mem_temp", 0);
    return EFML_SUCCESS;
}

EXPORT efmlReturn_t EfmlGetDevPwr(uint32_t idx, efmlDevPowerInfo_t *p) {
    CARD_CALL("EfmlGetDevPwr", idx);
    if (!p) return EFML_ERROR_INVALID_ARGUMENT;
    p->pwr_capability = (float)num(text, "power_capability", 0);
    p->cur_pwr_consumption = (float)num(text, "power", 0);
    return EFML_SUCCESS;
}

EXPORT efmlReturn_t EfmlGetDevIsLowPowerMode(uint32_t idx, bool *low) {
    CARD_CALL("EfmlGetDevIsLowPowerMode", idx);
    if (!low) return EFML_ERROR_INVALID_ARGUMENT;
    *low = num(text, "power_mode", 1) == 7;
    return EFML_SUCCESS;
}

EXPORT efmlReturn_t EfmlGetDevEccStatus(uint32_t idx, efmlEccStatus_t *ecc) {
    CARD_CALL("EfmlGetDevEccStatus", idx);
    if (!ecc) return EFML_ERROR_INVALID_ARGUMENT;
    memset(ecc, 0, sizeof *ecc);
    ecc->enabled = num(text, "ecc_enabled", 1) != 0;
    ecc->ecnt_sb = (uint32_t)num(text, "ecc_sbe", 0);
    ecc->ecnt_db = (uint32_t)num(text, "ecc_dbe", 0);
    return EFML_SUCCESS;
}

EXPORT efmlReturn_t EfmlGetDevRmaDetails(uint32_t idx, efmlRmaDetails_t *rma) {
    CARD_CALL("EfmlGetDevRmaDetails", idx);
    if (!rma) return EFML_ERROR_INVALID_ARGUMENT;
    memset(rma, 0, sizeof *rma);
    rma->is_dtu_support_rma = has(text, "rma_dbe");
    rma->dbe_count = (uint32_t)num(text, "rma_dbe", 0);
    return EFML_SUCCESS;
}

EXPORT efmlReturn_t EfmlGetPcieLinkInfo(uint32_t idx, efmlPcieLinkInfo_t *link) {
    CARD_CALL("EfmlGetPcieLinkInfo", idx);
    if (!link) return EFML_ERROR_INVALID_ARGUMENT;
    link->link_speed = (efmlPcieSpeed_t)num(text, "link_speed", 0);
    link->max_link_speed = (efmlPcieSpeed_t)num(text, "max_link_speed", 0);
    link->link_width = (efmlPcieWidth_t)num(text, "link_width", 0);
    link->max_link_width = (efmlPcieWidth_t)num(text, "max_link_width", 0);
    return EFML_SUCCESS;
}

EXPORT efmlReturn_t EfmlGetPcieThroughput(uint32_t idx, efmlPcieThroughputInfo_t *tp) {
    CARD_CALL("EfmlGetPcieThroughput", idx);
    if (!tp) return EFML_ERROR_INVALID_ARGUMENT;
    tp->tx_throughput = (float)num(text, "pcie_tx", 0);
    tp->rx_throughput = (float)num(text, "pcie_rx", 0);
    tp->tx_nak = (uint64_t)num(text, "pcie_tx_nak", 0);
    tp->rx_nak = (uint64_t)num(text, "pcie_rx_nak", 0);
    return EFML_SUCCESS;
}

EXPORT efmlReturn_t EfmlGetVdevCount(uint32_t idx, uint32_t *count) {
    CARD_CALL("EfmlGetVdevCount", idx);
    if (!count) return EFML_ERROR_INVALID_ARGUMENT;
    uint32_t n = 0;
    while (nth(text, "vdevs", n) >= 0) n++;
    *count = n;
    return EFML_SUCCESS;
}

EXPORT efmlReturn_t EfmlGetVdevList(uint32_t idx, uint32_t *ids, uint32_t *count) {
    CARD_CALL("EfmlGetVdevList", idx);
    if (!ids || !count) return EFML_ERROR_INVALID_ARGUMENT;
    uint32_t n = 0;
    /* No capacity is passed: the vendor's maximum, 128 (GCU_VDEV_MAX), is what a caller sizes. */
    for (double v; n < 128 && (v = nth(text, "vdevs", n)) >= 0; n++) ids[n] = (uint32_t)v;
    *count = n;
    return EFML_SUCCESS;
}

static int vdev_key(const char *text, uint32_t vdev, const char *what, char *key, size_t len) {
    uint32_t n = 0;
    for (double v; (v = nth(text, "vdevs", n)) >= 0; n++)
        if ((uint32_t)v == vdev) {
            snprintf(key, len, "vgcu%u_%s", vdev, what);
            return 0;
        }
    return -1;
}

EXPORT efmlReturn_t EfmlGetVdevDtuUsage(uint32_t idx, uint32_t vdev, float *usage) {
    char key[64];
    CARD_CALL("EfmlGetVdevDtuUsage", idx);
    if (!usage || vdev_key(text, vdev, "usage", key, sizeof key)) return EFML_ERROR_INVALID_ARGUMENT;
    *usage = (float)num(text, key, 0);
    return EFML_SUCCESS;
}

EXPORT efmlReturn_t EfmlGetVdevMem(uint32_t idx, uint32_t vdev, efmlDevMemInfo_t *mem) {
    char key[64];
    CARD_CALL("EfmlGetVdevMem", idx);
    if (!mem || vdev_key(text, vdev, "mem_total_bytes", key, sizeof key))
        return EFML_ERROR_INVALID_ARGUMENT;
    mem->mem_total_size = (uint64_t)num(text, key, 0);
    snprintf(key, sizeof key, "vgcu%u_mem_used_mib", vdev);
    mem->mem_used = (uint32_t)num(text, key, 0);
    return EFML_SUCCESS;
}

EXPORT efmlReturn_t EfmlGetMaxFreq(uint32_t idx, uint32_t *mhz) {
    CARD_CALL("EfmlGetMaxFreq", idx);
    if (!mhz) return EFML_ERROR_INVALID_ARGUMENT;
    if (!has(text, "max_dtu_clock_mhz")) return EFML_ERROR_NOT_SUPPORTED;
    *mhz = (uint32_t)num(text, "max_dtu_clock_mhz", 0);
    return EFML_SUCCESS;
}

/* The node's next event (a new event_seq), or TIMEOUT after timeout_ms (-1: wait on). */
EXPORT efmlReturn_t EfmlGetEvent(int timeout_ms, efmlEvent_t *event) {
    INSIDE;
    char text[FILE_MAX];
    if (!event) return EFML_ERROR_INVALID_ARGUMENT;
    for (long waited = 0;; waited += 20) {
        if (!g_initialized) return EFML_ERROR_UNINITIALIZED;
        if (read_file("node", text) != 0) return EFML_ERROR_DRIVER_NOT_LOADED;
        long seq = (long)num(text, "event_seq", 0);
        if (seq > g_event_seq) {
            g_event_seq = seq;
            memset(event, 0, sizeof *event);
            event->event_id = (uint32_t)num(text, "event_id", 0);
            event->event_type = (uint32_t)num(text, "event_type", 0);
            lookup(text, "event_msg", event->event_msg, sizeof event->event_msg);
            return EFML_SUCCESS;
        }
        if (timeout_ms >= 0 && waited >= timeout_ms) return EFML_ERROR_TIMEOUT;
        sleep_ms(20);
    }
}

#ifndef EFML_SIM_LEGACY
EXPORT efmlReturn_t EfmlGetHwArch(uint32_t idx, efmlHwArch_t *arch) {
    CARD_CALL("EfmlGetHwArch", idx);
    if (!arch) return EFML_ERROR_INVALID_ARGUMENT;
    *arch = (efmlHwArch_t)num(text, "arch", EFML_GCU300);
    return EFML_SUCCESS;
}

EXPORT efmlReturn_t EfmlGetDevSipUsage(uint32_t idx, float *usage) {
    CARD_CALL("EfmlGetDevSipUsage", idx);
    if (!usage) return EFML_ERROR_INVALID_ARGUMENT;
    *usage = (float)num(text, "sip_usage", 0);
    return EFML_SUCCESS;
}

EXPORT efmlReturn_t EfmlGetPowerMode(uint32_t idx, efmlPowerMode_t *mode) {
    CARD_CALL("EfmlGetPowerMode", idx);
    if (!mode) return EFML_ERROR_INVALID_ARGUMENT;
    *mode = (efmlPowerMode_t)num(text, "power_mode", EFML_POWER_ACTIVE);
    return EFML_SUCCESS;
}

EXPORT efmlReturn_t EfmlGetDevTempV2(uint32_t idx, efmlDevThermalInfoV2_t *t) {
    CARD_CALL("EfmlGetDevTempV2", idx);
    if (!t) return EFML_ERROR_INVALID_ARGUMENT;
    t->cur_asic_temp = (float)num(text, "asic_temp", 0);
    t->cur_mem_temp = (float)num(text, "mem_temp", 0);
    t->cur_board_temp = (float)num(text, "board_temp", 0);
    return EFML_SUCCESS;
}

EXPORT efmlReturn_t EfmlGetGcuVirtStatus(uint32_t idx, efmlGcuVirtMode_t *mode) {
    CARD_CALL("EfmlGetGcuVirtStatus", idx);
    if (!mode) return EFML_ERROR_INVALID_ARGUMENT;
    *mode = (efmlGcuVirtMode_t)num(text, "virt_mode", EFML_VIRT_HOST);
    return EFML_SUCCESS;
}
#endif
