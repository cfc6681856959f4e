# SPDX-License-Identifier: BSD-3-Clause
"""OkTopk's Spack package, built from this checkout (docs/tutorial.md, "Installing with pip or
Spack"): `spack repo add spack/spack_repo/oktopk`, then `spack install oktopk@main` with the
site's compilers, MPI and Kokkos (for a GPU, `+cuda cuda_arch=80` or `+rocm amdgpu_target=gfx90a`,
which Kokkos is then built for)."""

import os

from spack.package import *

try:
    # Spack 1.0 and later: the build systems are in the builtin repository, and compilers are
    # dependencies that a package names.
    from spack_repo.builtin.build_systems.cmake import CMakePackage
    from spack_repo.builtin.build_systems.cuda import CudaPackage
    from spack_repo.builtin.build_systems.rocm import ROCmPackage

    _COMPILERS_ARE_DEPENDENCIES = True
except ImportError:
    # Spack 0.x: spack.package holds them, and every package gets the compilers.
    _COMPILERS_ARE_DEPENDENCIES = False

# The checkout this repository lies in: spack/spack_repo/oktopk/packages/oktopk/package.py.
_CHECKOUT = os.path.abspath(os.path.join(os.path.dirname(__file__), *([os.pardir] * 5)))


class Oktopk(CMakePackage, CudaPackage, ROCmPackage):
    """Ok-Topk (Li and Hoefler, PPoPP'22), a sparse allreduce for data-parallel training that
    moves under 6k words per rank, and the methods it is measured against (dense allreduce,
    TopkA, TopkDSA, gTopk, Gaussian-k, S2 Reducer): Kokkos kernels, MPI communication, C, C++,
    Fortran and Python interfaces."""

    homepage = "file://" + os.path.join(_CHECKOUT, "README.md")
    git = "file://" + _CHECKOUT

    license("BSD-3-Clause")

    version("main", branch="main")

    variant("openmp", default=True, description="Kokkos with its OpenMP backend")
    variant("shared", default=True, description="Shared libraries (Kokkos' too)")
    variant("python", default=False, description="The Python package oktopk and its DDP hook")
    variant("fortran", default=True, description="The Fortran module over the C interface")
    variant("apps", default=False,
            description="The programs in apps/ (training and benchmarks; need Kokkos Kernels)")
    variant("gpu_aware_mpi", default="auto", values=("auto", "on", "off"), multi=False,
            description="How device buffers reach MPI where OKTOPK_GPU_AWARE_MPI is unset at "
            "run time: as MPI says, device pointers, or host copies")

    if _COMPILERS_ARE_DEPENDENCIES:
        depends_on("c", type="build")
        depends_on("cxx", type="build")
        depends_on("fortran", type="build", when="+fortran")

    depends_on("cmake@3.16:", type="build")
    depends_on("mpi")
    depends_on("kokkos@3.4:")
    depends_on("kokkos+openmp", when="+openmp")
    depends_on("kokkos~openmp", when="~openmp")
    # The Python module links liboktopk, which links Kokkos: shared throughout.
    depends_on("kokkos+shared", when="+shared")
    depends_on("kokkos+shared", when="+python")
    conflicts("~shared", when="+python", msg="the Python module needs shared libraries")

    # Kokkos is built for the GPU OkTopk is built for; below Kokkos 4 it needs device lambdas
    # (CUDA_LAMBDA), which every OkTopk kernel is.
    for _arch in CudaPackage.cuda_arch_values:
        depends_on(f"kokkos+cuda cuda_arch={_arch}", when=f"+cuda cuda_arch={_arch}")
    depends_on("kokkos~cuda", when="~cuda")
    conflicts("^kokkos@:3~cuda_lambda", when="+cuda",
              msg="Kokkos below 4 must be built +cuda_lambda for OkTopk's device lambdas")
    conflicts("+cuda", when="cuda_arch=none", msg="name the GPU: cuda_arch=60, 80, 90, ...")
    for _target in ROCmPackage.amdgpu_targets:
        depends_on(f"kokkos+rocm amdgpu_target={_target}", when=f"+rocm amdgpu_target={_target}")
    depends_on("kokkos~rocm", when="~rocm")
    conflicts("+rocm", when="amdgpu_target=none", msg="name the GPU: amdgpu_target=gfx90a, ...")
    conflicts("+cuda", when="+rocm", msg="one GPU backend at a time")

    depends_on("kokkos-kernels", when="+apps")
    depends_on("zlib-api", when="+apps")

    extends("python", when="+python")
    depends_on("py-pybind11@2.12:", type="build", when="+python")
    depends_on("py-numpy", type=("build", "run"), when="+python")
    depends_on("py-mpi4py", type=("build", "run"), when="+python")

    depends_on("googletest", type="test")

    def cmake_args(self):
        spec = self.spec
        args = [
            self.define("Kokkos_ROOT", spec["kokkos"].prefix),
            self.define("MPI_CXX_COMPILER", spec["mpi"].mpicxx),
            self.define_from_variant("BUILD_SHARED_LIBS", "shared"),
            self.define_from_variant("OKTOPK_ENABLE_PYTHON", "python"),
            self.define_from_variant("OKTOPK_ENABLE_FORTRAN", "fortran"),
            self.define_from_variant("OKTOPK_ENABLE_APPS", "apps"),
            self.define_from_variant("OKTOPK_GPU_AWARE_MPI", "gpu_aware_mpi"),
            self.define("OKTOPK_ENABLE_TESTS", self.run_tests),
        ]
        if spec.satisfies("+cuda"):
            # Kokkos' compiler wrapper (nvcc_wrapper), as Kokkos requires for CUDA.
            args.append(self.define("CMAKE_CXX_COMPILER", spec["kokkos"].kokkos_cxx))
        if spec.satisfies("+rocm"):
            args.append(self.define("CMAKE_CXX_COMPILER", spec["hip"].hipcc))
        if spec.satisfies("+apps"):
            args.append(self.define("KokkosKernels_ROOT", spec["kokkos-kernels"].prefix))
        if spec.satisfies("+python"):
            python = spec["python"]
            args.append(self.define("Python3_EXECUTABLE", python.command.path))
            args.append(self.define("OKTOPK_PYTHON_INSTALL_DIR", python.package.platlib))
        return args
