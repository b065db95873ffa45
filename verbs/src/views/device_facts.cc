#include "views/device_facts.h"

#include <arpa/inet.h>
#include <net/if.h>

namespace ff::verbs {

bool QueryDeviceFacts(DeviceFacts* a) {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (list == nullptr) return false;
  bool ok = false;
  if (n > 0) {
    a->name = ibv_get_device_name(list[0]);
    a->uverbs = list[0]->dev_name;
    a->index = ibv_get_device_index(list[0]);
    if (ibv_context* ctx = ibv_open_device(list[0])) {
      ok = ibv_query_device(ctx, &a->device) == 0 && ibv_query_port(ctx, 1, &a->port) == 0;
      for (int i = 0; ok && i < a->port.gid_tbl_len; ++i) {
        ibv_gid_entry e{};
        ok = ibv_query_gid_ex(ctx, 1, static_cast<uint32_t>(i), &e, 0) == 0;
        a->gids.push_back(e);
      }
      for (int i = 0; ok && i < a->port.pkey_tbl_len; ++i) {
        __be16 pkey = 0;
        ok = ibv_query_pkey(ctx, 1, i, &pkey) == 0;
        a->pkeys.push_back(ntohs(pkey));
      }
      ibv_close_device(ctx);
    }
  }
  char ifname[IF_NAMESIZE] = "";
  if (ok && !a->gids.empty() && a->gids[0].ndev_ifindex != 0 &&
      ::if_indextoname(a->gids[0].ndev_ifindex, ifname) != nullptr) {
    a->netdev_index = a->gids[0].ndev_ifindex;
    a->netdev = ifname;
  }
  ibv_free_device_list(list);
  return ok;
}

}  // namespace ff::verbs
