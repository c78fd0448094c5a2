/* Moved to quant/fp16.h; this forward stays until every includer uses the new path. */
#include "quant/fp16.h"
