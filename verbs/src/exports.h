// Included by every file that defines libibverbs entry points. verbs.h turns a few of
// them into macros that call inline wrappers; the library must define the real symbols.
#pragma once

#include "internal.h"

#undef ibv_get_device_list
#undef ibv_query_port
#undef ibv_reg_mr
#undef ibv_reg_mr_iova

#define FFV_EXPORT __attribute__((visibility("default")))

namespace ffv {
ibv_qp* CreateQpEx(ibv_context* context, ibv_qp_init_attr_ex* attr);
}  // namespace ffv
