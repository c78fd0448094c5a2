/* fault — the fault-injection hooks of the ferry_fault test binary (tests/fault/fault.c describes the
 * switches). Each wrapped call asks fault_should_fail(class, its return address) whether to fail this time.
 */
#ifndef FERRY_TESTS_FAULT_H
#define FERRY_TESTS_FAULT_H

enum { FAULT_ALLOC = 0, FAULT_FILE = 1, FAULT_CUDA = 2 };

int fault_should_fail(int cls, void *ret);

#endif
