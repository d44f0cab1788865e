"""`acl.media`: media-processing (DVPP) memory, 128-byte aligned."""

from .. import runtime as _rt
from ._result import code_of, values_and_code


def dvpp_malloc(size):
    return values_and_code(_rt.dvpp_malloc, size)


def dvpp_free(dev_ptr):
    return code_of(_rt.dvpp_free, dev_ptr)
