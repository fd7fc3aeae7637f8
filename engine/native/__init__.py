"""Native CPU kernels: C++ sources in this folder, built once per machine with the system's C++
compiler and called through ctypes (`build.load`). Every caller keeps a torch path for when no
compiler is found or OPENCLAW_CPU_KERNELS=0."""
