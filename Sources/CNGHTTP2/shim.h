#ifndef CNGHTTP2_SHIM_H
#define CNGHTTP2_SHIM_H
#include <nghttp2/nghttp2.h>
// HTTP2 module: Linux event APIs that the Glibc module leaves out.
#include <sys/epoll.h>
#include <sys/eventfd.h>
#endif
