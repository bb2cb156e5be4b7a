/*
 * What goes over the wire in gradient reductions (--grad-reduce), on its own so that the command line
 * (train/cli.h) can parse the flag without the communication layer: FP32 (the default, exact rank-order
 * sums), BF16 (each contribution rounded to BF16) or FP8 (E4M3 codes with one FP32 scale_inv per
 * ZERO_CHUNK-element chunk, summed in FP32 after dequantization: comm/grad_fp8.h).
 */
#pragma once

#include <string.h>

typedef enum { WIRE_F32 = 0, WIRE_BF16 = 1, WIRE_FP8 = 2 } CommWire;

#define COMM_WIRES 3

/* The --grad-reduce values, indexed by CommWire. */
static const char* const COMM_WIRE_NAMES[COMM_WIRES] = {"fp32", "bf16", "fp8"};
