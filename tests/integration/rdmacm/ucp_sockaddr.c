// UCX's client/server API over a socket address (issue 12): ucp_listener_create and
// ucp_ep_create with UCP_EP_PARAMS_FLAGS_CLIENT_SERVER, whose connection manager is UCX's
// rdmacm component when a device is there (UCX_SOCKADDR_TLS_PRIORITY). This is how
// UCX-Py, Dask, Spark's UCX shuffle and ucp_client_server-style programs connect.
//   ucp_sockaddr server PORT      accept one client; receive 1 MiB (tag 1), check its
//                                 pattern, answer its sum (tag 2)
//   ucp_sockaddr client IP PORT   send 1 MiB, check the answer
// Prints "LISTENING", "request from IP", "server got N bytes, sum S" / "client got sum S",
// then "<side> done"; exit 0, or 1 with the reason. Every wait has a deadline and a watchdog
// ends a process that blocks.
#include <arpa/inet.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

enum { kBytes = 1 << 20, kWatchdogS = 60 };
static const double kWaitS = 20;

static double NowS(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static ucp_listener_h g_listener;
static ucp_conn_request_h g_request;

// The first request is served; any other is turned down.
static void OnConnRequest(ucp_conn_request_h request, void* arg) {
  (void)arg;
  if (g_request == NULL)
    g_request = request;
  else
    ucp_listener_reject(g_listener, request);
}

static void OnEndpointError(void* arg, ucp_ep_h ep, ucs_status_t status) {
  (void)arg;
  (void)ep;
  fprintf(stderr, "endpoint error: %s\n", ucs_status_string(status));
}

// Progresses `w` until request `r` completes (NULL: it completed at once). 0, or 1 with a
// message naming `what`.
static int Wait(ucp_worker_h w, void* r, const char* what) {
  if (r == NULL) return 0;
  if (UCS_PTR_IS_ERR(r)) {
    fprintf(stderr, "%s: %s\n", what, ucs_status_string(UCS_PTR_STATUS(r)));
    return 1;
  }
  const double end = NowS() + kWaitS;
  ucs_status_t st;
  while ((st = ucp_request_check_status(r)) == UCS_INPROGRESS && NowS() < end)
    ucp_worker_progress(w);
  if (st == UCS_INPROGRESS) ucp_request_cancel(w, r);
  ucp_request_free(r);
  if (st != UCS_OK) {
    fprintf(stderr, "%s: %s\n", what, st == UCS_INPROGRESS ? "timed out" : ucs_status_string(st));
    return 1;
  }
  return 0;
}

static uint64_t Sum(const unsigned char* p, size_t n) {
  uint64_t s = 0;
  for (size_t i = 0; i < n; ++i) s = s * 31 + p[i];
  return s;
}

static int Serve(ucp_worker_h w, ucp_ep_h ep, unsigned char* buf) {
  ucp_request_param_t rp;
  memset(&rp, 0, sizeof(rp));
  if (Wait(w, ucp_tag_recv_nbx(w, buf, kBytes, 1, (ucp_tag_t)-1, &rp), "receive")) return 1;
  for (size_t i = 0; i < kBytes; ++i) {
    if (buf[i] != (unsigned char)(i * 7 + 3)) {
      fprintf(stderr, "byte %zu is %u, want %u\n", i, buf[i], (unsigned char)(i * 7 + 3));
      return 1;
    }
  }
  uint64_t sum = Sum(buf, kBytes);
  printf("server got %d bytes, sum %llu\n", kBytes, (unsigned long long)sum);
  return Wait(w, ucp_tag_send_nbx(ep, &sum, sizeof(sum), 2, &rp), "send the sum");
}

static int Ask(ucp_worker_h w, ucp_ep_h ep, unsigned char* buf) {
  ucp_request_param_t rp;
  memset(&rp, 0, sizeof(rp));
  for (size_t i = 0; i < kBytes; ++i) buf[i] = (unsigned char)(i * 7 + 3);
  if (Wait(w, ucp_tag_send_nbx(ep, buf, kBytes, 1, &rp), "send")) return 1;
  uint64_t sum = 0;
  if (Wait(w, ucp_tag_recv_nbx(w, &sum, sizeof(sum), 2, (ucp_tag_t)-1, &rp), "receive the sum"))
    return 1;
  printf("client got sum %llu\n", (unsigned long long)sum);
  if (sum != Sum(buf, kBytes)) {
    fprintf(stderr, "the server's sum is not the sum of what was sent\n");
    return 1;
  }
  return 0;
}

int main(int argc, char** argv) {
  const int server = argc == 3 && strcmp(argv[1], "server") == 0;
  if (!server && !(argc == 4 && strcmp(argv[1], "client") == 0)) {
    fprintf(stderr, "usage: %s server PORT | client IP PORT\n", argv[0]);
    return 2;
  }
  alarm(kWatchdogS);
  ucp_params_t p;
  memset(&p, 0, sizeof(p));
  p.field_mask = UCP_PARAM_FIELD_FEATURES;
  p.features = UCP_FEATURE_TAG;
  ucp_context_h ctx;
  ucp_worker_h w;
  ucp_worker_params_t wp;
  memset(&wp, 0, sizeof(wp));
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;
  if (ucp_init(&p, NULL, &ctx) != UCS_OK || ucp_worker_create(ctx, &wp, &w) != UCS_OK) {
    fprintf(stderr, "cannot set up UCX\n");
    return 1;
  }
  struct sockaddr_in sa;
  memset(&sa, 0, sizeof(sa));
  sa.sin_family = AF_INET;
  sa.sin_port = htons((uint16_t)atoi(argv[server ? 2 : 3]));
  ucp_ep_params_t ep_params;
  memset(&ep_params, 0, sizeof(ep_params));
  ep_params.field_mask = UCP_EP_PARAM_FIELD_ERR_HANDLER | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
  ep_params.err_handler.cb = OnEndpointError;
  ep_params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  if (server) {
    ucp_listener_params_t lp;
    memset(&lp, 0, sizeof(lp));
    lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
    lp.sockaddr.addr = (const struct sockaddr*)&sa;
    lp.sockaddr.addrlen = sizeof(sa);
    lp.conn_handler.cb = OnConnRequest;
    const ucs_status_t st = ucp_listener_create(w, &lp, &g_listener);
    if (st != UCS_OK) {
      fprintf(stderr, "ucp_listener_create: %s\n", ucs_status_string(st));
      return 1;
    }
    printf("LISTENING\n");
    fflush(stdout);
    const double end = NowS() + kWaitS;
    while (g_request == NULL && NowS() < end) ucp_worker_progress(w);
    if (g_request == NULL) {
      fprintf(stderr, "no client within %.0f s\n", kWaitS);
      return 1;
    }
    ucp_conn_request_attr_t ra;
    memset(&ra, 0, sizeof(ra));
    ra.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
    char who[INET_ADDRSTRLEN] = "?";
    if (ucp_conn_request_query(g_request, &ra) == UCS_OK)
      inet_ntop(AF_INET, &((const struct sockaddr_in*)&ra.client_address)->sin_addr, who,
                sizeof(who));
    printf("request from %s\n", who);
    ep_params.field_mask |= UCP_EP_PARAM_FIELD_CONN_REQUEST;
    ep_params.conn_request = g_request;
  } else {
    if (inet_pton(AF_INET, argv[2], &sa.sin_addr) != 1) {
      fprintf(stderr, "not an IPv4 address: %s\n", argv[2]);
      return 2;
    }
    ep_params.field_mask |= UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR;
    ep_params.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    ep_params.sockaddr.addr = (const struct sockaddr*)&sa;
    ep_params.sockaddr.addrlen = sizeof(sa);
  }
  ucp_ep_h ep;
  const ucs_status_t st = ucp_ep_create(w, &ep_params, &ep);
  if (st != UCS_OK) {
    fprintf(stderr, "ucp_ep_create: %s\n", ucs_status_string(st));
    return 1;
  }
  unsigned char* buf = malloc(kBytes);
  if (buf == NULL) return 1;
  const int rc = server ? Serve(w, ep, buf) : Ask(w, ep, buf);
  // Both close with a flush: what each sent arrives before its endpoint goes.
  ucp_request_param_t cp;
  memset(&cp, 0, sizeof(cp));
  Wait(w, ucp_ep_close_nbx(ep, &cp), "close");
  free(buf);
  if (g_listener != NULL) ucp_listener_destroy(g_listener);
  ucp_worker_destroy(w);
  ucp_cleanup(ctx);
  printf("%s %s\n", server ? "server" : "client", rc == 0 ? "done" : "FAILED");
  return rc;
}
