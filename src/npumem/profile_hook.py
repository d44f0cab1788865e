"""NPUMEM_PROFILE=1 for any Python program: imported at interpreter start by the
npumem-profile.pth file that installing npumem puts in site-packages, only when NPUMEM_PROFILE
is set (the .pth line tests the variable itself, so other programs never import npumem).
It starts npumem.profile's whole-process session; the folder is written at exit."""

from npumem import profile as _profile

_profile._start_from_environment()
