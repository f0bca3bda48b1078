/* The libefml types the simulated library exports, laid out as ../shared/EFML.md section 3 states
 * (vendored efml.h 1.2.3.5, x86-64). tests/simulation/test_efml_sim.py compiles a probe against this
 * header and checks every size and offset against that table, and against the Python binding. */
#ifndef ENFLAME_EFML_SIM_TYPES_H
#define ENFLAME_EFML_SIM_TYPES_H

#include <stdbool.h>
#include <stdint.h>

typedef enum {
    EFML_SUCCESS = 0,
    EFML_ERROR_UNINITIALIZED = 1,
    EFML_ERROR_INVALID_ARGUMENT = 2,
    EFML_ERROR_NOT_SUPPORTED = 3,
    EFML_ERROR_LIBRARY_NOT_FOUND = 4,
    EFML_ERROR_INVALID_ERROR_CODE = 5,
    EFML_ERROR_DRIVER_NOT_LOADED = 6,
    EFML_ERROR_GCU_LARE_PORT_NUMBER_ERR = 7,
    EFML_ERROR_INVALID_INPUT = 8,
    EFML_ERROR_FUNCTION_NOT_FOUND = 9,
    EFML_ERROR_OPEN_DRIVER_VERSION = 10,
    EFML_ERROR_DRIVER_NOT_COMPATIBLE = 11,
    EFML_ERROR_NO_DEVICE = 12,
    EFML_ERROR_DEPRECATION = 13,
    EFML_ERROR_TIMEOUT = 253,
    EFML_ERROR_FAIL = 254,
    EFML_ERROR_MAX = 255
} efmlReturn_t;

typedef enum { EFML_GCU200 = 0, EFML_GCU210 = 1, EFML_GCU300 = 2 } efmlHwArch_t;
typedef enum { EFML_POWER_ACTIVE = 1, EFML_POWER_SUSPEND = 5, EFML_POWER_SLEEP = 7 } efmlPowerMode_t;
typedef enum {
    EFML_VIRT_HOST = 0, EFML_VIRT_VGCU = 1, EFML_VIRT_MDEV = 2,
    EFML_VIRT_SRIOV_PF = 3, EFML_VIRT_SRIOV_VF = 4
} efmlGcuVirtMode_t;
typedef enum { EFML_PCIE_GEN_PLACEHOLDER = 0 } efmlPcieSpeed_t;
typedef enum { EFML_PCIE_WIDTH_PLACEHOLDER = 0 } efmlPcieWidth_t;

typedef struct {
    char name[128];
    uint32_t vendor_id, device_id, domain_id, bus_id, dev_id, func_id, logic_id;
} efmlDeviceInfo_t; /* 156 */

typedef struct { float pwr_capability; float cur_pwr_consumption; } efmlDevPowerInfo_t; /* 8 */

typedef struct { uint64_t mem_total_size; uint32_t mem_used; } efmlDevMemInfo_t; /* 16 */
typedef efmlDevMemInfo_t efmlClusterHbmMemInfo_t;

typedef struct { uint32_t cur_hbm_clock; uint32_t cur_dtu_clock; } efmlDevClkInfo_t; /* 8 */

typedef struct { float cur_asic_temp, cur_mem_temp, cur_board_temp; } efmlDevThermalInfoV2_t;
typedef struct { float cur_dev_temp, cur_hbm0_temp, cur_hbm1_temp; } efmlDevThermalInfo_t;

typedef struct {
    efmlPcieSpeed_t link_speed, max_link_speed;
    efmlPcieWidth_t link_width, max_link_width;
} efmlPcieLinkInfo_t; /* 16 */

typedef struct {
    float tx_throughput, rx_throughput;
    uint64_t tx_nak, rx_nak;
} efmlPcieThroughputInfo_t; /* 24 */

typedef struct {
    bool enabled, pending, pdblack;
    uint32_t ecnt_sb, ecnt_db;
} efmlEccStatus_t; /* 12 */

typedef struct { bool is_dtu_support_rma; bool flags; } efmlRmaStatus_t; /* 2 */
typedef struct { bool is_dtu_support_rma; bool flags; uint32_t dbe_count; } efmlRmaDetails_t; /* 8 */

typedef struct { uint32_t event_id; uint32_t event_type; char event_msg[128]; } efmlEvent_t; /* 136 */

typedef struct { uint32_t pid; uint64_t dev_mem_usage; uint64_t sys_mem_usage; } efmlProcessInfo_t; /* 24 */

#endif
