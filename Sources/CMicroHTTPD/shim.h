#ifndef CMICROHTTPD_SHIM_H
#define CMICROHTTPD_SHIM_H
#include <stdarg.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <microhttpd.h>

/* MHD_get_connection_info and MHD_get_daemon_info are variadic, which Swift cannot call.
   These wrappers cover the info types that take no extra arguments. */
static inline const union MHD_ConnectionInfo *
cmhd_get_connection_info(struct MHD_Connection *connection, enum MHD_ConnectionInfoType info_type) {
    return MHD_get_connection_info(connection, info_type);
}

static inline const union MHD_DaemonInfo *
cmhd_get_daemon_info(struct MHD_Daemon *daemon, enum MHD_DaemonInfoType info_type) {
    return MHD_get_daemon_info(daemon, info_type);
}
#endif
