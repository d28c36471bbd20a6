#include "dsv4/kernels/kernels_internal.h"
namespace dsv4::kernels::detail {
const Table* avx512_table() { return nullptr; }
}
