// libhalka_python.so: the SDK (halka::Client), LocalCluster and the
// embedded servers, linked whole into one shared library that both Python
// extension modules load. Nothing is defined here; the library's content
// comes from the whole archives (client/python/CMakeLists.txt).
#include "halka/client.h"
#include "halka/embedded.h"
#include "halka/local_cluster.h"
