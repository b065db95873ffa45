// The libc functions libfsocket stands in front of, called through the next definition
// after this library (dlsym(RTLD_NEXT)), so that another preload further down the chain
// still sees the call. The library never calls the plain names for a socket it manages:
// those would come back to its own interposers.
#pragma once

#include <poll.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>

namespace ff::fsocket::real {

int socket(int domain, int type, int protocol);
int connect(int fd, const sockaddr* addr, socklen_t len);
int bind(int fd, const sockaddr* addr, socklen_t len);
int listen(int fd, int backlog);
int accept4(int fd, sockaddr* addr, socklen_t* len, int flags);
int close(int fd);
int dup(int fd);
int dup2(int fd, int fd2);
int dup3(int fd, int fd2, int flags);
int fcntl_int(int fd, int cmd, int arg);
int shutdown(int fd, int how);
ssize_t recv(int fd, void* buf, size_t len, int flags);
ssize_t send(int fd, const void* buf, size_t len, int flags);
ssize_t read(int fd, void* buf, size_t len);
ssize_t write(int fd, const void* buf, size_t len);
int poll(pollfd* fds, nfds_t n, int timeout);
int ppoll(pollfd* fds, nfds_t n, const timespec* timeout, const sigset_t* mask);
int epoll_ctl(int epfd, int op, int fd, epoll_event* ev);
int epoll_wait(int epfd, epoll_event* evs, int max, int timeout);
int epoll_pwait(int epfd, epoll_event* evs, int max, int timeout, const sigset_t* mask);
int getsockopt(int fd, int level, int name, void* val, socklen_t* len);
int setsockopt(int fd, int level, int name, const void* val, socklen_t len);
int getsockname(int fd, sockaddr* addr, socklen_t* len);
int getpeername(int fd, sockaddr* addr, socklen_t* len);
int sigaction(int sig, const struct sigaction* act, struct sigaction* old);

// Looks up `name` after this library; nullptr when there is none.
void* Next(const char* name);

}  // namespace ff::fsocket::real
