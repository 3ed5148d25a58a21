// halkactl's `allreduce` command: one checked all-reduce, reduce-scatter
// or all-gather (--coll) through a running worker, a line per operation.
// The flags are halkactl's (halkactl.cc).
#ifndef HALKA_CLIENT_HALKACTL_ALLREDUCE_CMD_H_
#define HALKA_CLIENT_HALKACTL_ALLREDUCE_CMD_H_

#include "halka/client.h"

namespace halka {

// Every rank runs it with the same flags, so each checks its own result
// against every rank's generated input. Exit status: 0, or 1 on a failed
// call or a wrong element.
int AllReduceCommand(const Client::Options& client_options);

}  // namespace halka

#endif  // HALKA_CLIENT_HALKACTL_ALLREDUCE_CMD_H_
