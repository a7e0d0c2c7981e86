#ifndef C_HIREDIS_SHIM_H
#define C_HIREDIS_SHIM_H
// Commands go through redisAppendCommandArgv / redisGetReply, which import as they are: no shim is needed.
#include <hiredis/hiredis.h>
#endif
