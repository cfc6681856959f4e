! SPDX-License-Identifier: BSD-3-Clause
! The Fortran module: a handle made once on MPI_COMM_WORLD, a reduce per step on real(4)
! arrays, and the stats of the last call; every function returns OKTOPK_SUCCESS or an error
! code, with the message in oktopk_last_error().
!   mpirun -np 2 ./fortran_reduce
program fortran_reduce
  use mpi
  use oktopk
  use, intrinsic :: iso_c_binding, only: c_float, c_int64_t
  implicit none

  integer(c_int64_t), parameter :: n = 50000
  real(c_float), allocatable :: grad(:), out(:)
  type(oktopk_handle) :: handle
  type(oktopk_stats) :: stats
  integer :: rank, nranks, ierr, step
  integer(c_int64_t) :: i

  call mpi_init(ierr)
  call mpi_comm_rank(MPI_COMM_WORLD, rank, ierr)
  call mpi_comm_size(MPI_COMM_WORLD, nranks, ierr)
  call check(oktopk_initialize(), 'oktopk_initialize')
  allocate (grad(n), out(n))

  call check(oktopk_create(MPI_COMM_WORLD, 'oktopk', n, 'density=0.01 warmup_iterations=2', &
                           handle), 'oktopk_create')
  do step = 1, 10
    do i = 1, n
      grad(i) = real(mod(i * 31 + rank * 7 + step, 97_c_int64_t), c_float) / 97.0 - 0.5
    end do
    call check(oktopk_reduce(handle, grad, out), 'oktopk_reduce')
  end do
  call check(oktopk_get_stats(handle, stats), 'oktopk_get_stats')
  if (rank == 0) then
    write (*, '(a, i0, a, i0, a, i0, a, i0, a, i0)') 'fortran_reduce: ', nranks, &
      ' ranks: call ', stats%iteration, ' kept ', stats%global_selected, ' entries (k = ', &
      stats%k, '), non-zero ', count(out /= 0.0)
  end if
  call check(oktopk_destroy(handle), 'oktopk_destroy')
  call check(oktopk_finalize(), 'oktopk_finalize')
  call mpi_finalize(ierr)

contains

  ! Ends the job on a failed call: the same code comes back on every rank for agreed errors.
  subroutine check(code, what)
    integer, intent(in) :: code
    character(len=*), intent(in) :: what
    integer :: ierr
    if (code /= OKTOPK_SUCCESS) then
      write (0, '(3a, i0, 2a)') 'fortran_reduce: ', what, ' failed (', code, '): ', &
        oktopk_last_error()
      call mpi_abort(MPI_COMM_WORLD, 1, ierr)
    end if
  end subroutine check

end program fortran_reduce
