/* Moved to quant/dtype.h (the type table sits below the kernels that read it); this forward stays until every
 * includer uses the new path. */
#include "quant/dtype.h"
