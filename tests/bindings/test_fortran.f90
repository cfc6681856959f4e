! SPDX-License-Identifier: BSD-3-Clause
! The Fortran module as a Fortran program uses it, at any number of ranks: results the same on every
! rank, in place equal to out of place, dense equal to the mean, error codes for NaN and mismatched
! n on every rank, stats, and a state round trip; every method on real(8) arrays through the same
! generic functions, and arrays of the wrong kind refused on every rank. Prints "N passed, N failed"
! on rank 0 and stops with a non-zero code on any failure.
program test_fortran
  use mpi
  use oktopk
  use, intrinsic :: iso_c_binding, only: c_float, c_double, c_int, c_int32_t, c_int64_t, &
                                         c_intptr_t, c_loc
  use, intrinsic :: ieee_arithmetic, only: ieee_value, ieee_quiet_nan
  implicit none

  integer :: rank, nranks, ierr, passed = 0, failed = 0
  integer(c_int64_t), parameter :: n = 2000
  character(len=*), parameter :: methods(7) = &
    [character(len=9) :: 'dense', 'topka', 'topkdsa', 'gtopk', 'gaussiank', 'oktopk', 's2']
  integer :: m

  call mpi_init(ierr)
  call mpi_comm_rank(MPI_COMM_WORLD, rank, ierr)
  call mpi_comm_size(MPI_COMM_WORLD, nranks, ierr)
  call check(oktopk_initialize() == OKTOPK_SUCCESS, 'initialize')
  call check(len(oktopk_version()) >= 5, 'version')

  do m = 1, size(methods)
    call test_method(trim(methods(m)))
  end do
  call test_errors()
  do m = 1, size(methods)
    call test_real8(trim(methods(m)))
  end do
  call test_kind_errors()
  call test_layout('s2')
  call test_layout('topka')
  call test_layout_errors()
  call test_on_stream()
  call test_reduce_scatter()

  call check(oktopk_finalize() == OKTOPK_SUCCESS, 'finalize')
  if (rank == 0) write (*, '(i0, a, i0, a)') passed, ' passed, ', failed, ' failed'
  call mpi_finalize(ierr)
  if (failed /= 0) stop 1

contains

  ! Counts a check on every rank; it fails if it fails on any rank.
  subroutine check(ok, what)
    logical, intent(in) :: ok
    character(len=*), intent(in) :: what
    logical :: all_ok
    integer :: ierr
    call mpi_allreduce(ok, all_ok, 1, MPI_LOGICAL, MPI_LAND, MPI_COMM_WORLD, ierr)
    if (all_ok) then
      passed = passed + 1
    else
      failed = failed + 1
      if (.not. ok) write (0, '(a, i0, 4a)') 'rank ', rank, ': FAILED: ', what, &
                                             ' (last error: ', oktopk_last_error() // ')'
    end if
  end subroutine check

  ! Deterministic gradient of rank r in call c: small noise, with every 29th entry large.
  pure real(c_float) function gradient_value(r, i, c)
    integer, intent(in) :: r, c
    integer(c_int64_t), intent(in) :: i
    integer :: h
    h = int(mod(i * 7919_c_int64_t + r * 104729 + c * 1299709, 10007_c_int64_t))
    gradient_value = real(h, c_float) / 10007.0 - 0.5
    if (mod(i + r, 29_c_int64_t) == 0) gradient_value = gradient_value * 8.0 + sign(4.0, gradient_value)
  end function gradient_value

  subroutine fill(g, r, c)
    real(c_float), intent(out) :: g(:)
    integer, intent(in) :: r, c
    integer(c_int64_t) :: i
    do i = 1, size(g, kind=c_int64_t)
      g(i) = gradient_value(r, i, c)
    end do
  end subroutine fill

  ! The bit patterns of a real array, to compare results exactly.
  pure function bits(v) result(b)
    real(c_float), intent(in) :: v(:)
    integer(c_int32_t) :: b(size(v))
    b = transfer(v, 0_c_int32_t, size(v))
  end function bits

  ! The last call's phases: named, and their bytes summing to the call's, inside and between
  ! nodes.
  logical function phases_add_up(handle, stats)
    type(oktopk_handle), intent(in) :: handle
    type(oktopk_stats), intent(in) :: stats
    type(oktopk_phase_stats) :: phase
    integer(c_int64_t) :: phases, i, sent, received, sent_between, received_between
    integer :: code
    ! One call a statement: Fortran may skip a function call inside .and.
    code = oktopk_get_num_phases(handle, phases)
    phases_add_up = code == OKTOPK_SUCCESS .and. phases > 0
    sent = 0; received = 0; sent_between = 0; received_between = 0
    do i = 1, phases
      code = oktopk_get_phase_stats(handle, i, phase)
      phases_add_up = phases_add_up .and. code == OKTOPK_SUCCESS .and. &
                      phase%name(1) /= achar(0) .and. &
                      phase%bytes_sent_between_nodes <= phase%bytes_sent
      sent = sent + phase%bytes_sent
      received = received + phase%bytes_received
      sent_between = sent_between + phase%bytes_sent_between_nodes
      received_between = received_between + phase%bytes_received_between_nodes
    end do
    phases_add_up = phases_add_up .and. sent == stats%bytes_sent .and. &
                    received == stats%bytes_received .and. &
                    sent_between == stats%bytes_sent_between_nodes .and. &
                    received_between == stats%bytes_received_between_nodes
    ! Out of range: refused.
    code = oktopk_get_phase_stats(handle, phases + 1, phase)
    phases_add_up = phases_add_up .and. code /= OKTOPK_SUCCESS
  end function phases_add_up

  ! The same bits on every rank.
  logical function identical_on_all_ranks(v)
    real(c_float), intent(in) :: v(:)
    integer(c_int32_t), allocatable :: mine(:), lo(:), hi(:)
    integer :: ierr
    allocate(mine(size(v)), lo(size(v)), hi(size(v)))
    mine = bits(v)
    call mpi_allreduce(mine, lo, size(v), MPI_INTEGER4, MPI_MIN, MPI_COMM_WORLD, ierr)
    call mpi_allreduce(mine, hi, size(v), MPI_INTEGER4, MPI_MAX, MPI_COMM_WORLD, ierr)
    identical_on_all_ranks = all(lo == mine) .and. all(hi == mine)
  end function identical_on_all_ranks

  subroutine test_method(method)
    character(len=*), intent(in) :: method
    type(oktopk_handle) :: a, b
    type(oktopk_stats) :: stats
    real(c_float), allocatable :: grad(:), out(:), inplace(:), first(:)
    real(c_float) :: mean
    logical :: codes_ok, same, identical, values_ok, same_here
    integer :: c, r, code_a, code_b, code_c, code_d
    integer(c_int64_t) :: i
    character(len=64) :: path

    call check(oktopk_create(MPI_COMM_WORLD, method, n, 'density=0.02 threshold_period=4', a) &
               == OKTOPK_SUCCESS, method // ': create')
    call check(oktopk_create(MPI_COMM_WORLD, method, n, 'density=0.02,threshold_period=4', b) &
               == OKTOPK_SUCCESS, method // ': create a second handle')
    allocate(grad(n), out(n), inplace(n), first(n))
    codes_ok = .true.; same = .true.; identical = .true.; values_ok = .true.
    do c = 1, 5
      call fill(grad, rank, c)
      inplace = grad
      ! One call a statement: Fortran may skip a function call inside .and.
      code_a = oktopk_reduce(a, grad, out)
      code_b = oktopk_reduce_inplace(b, inplace)
      codes_ok = codes_ok .and. code_a == OKTOPK_SUCCESS .and. code_b == OKTOPK_SUCCESS
      same = same .and. all(bits(out) == bits(inplace))
      same_here = identical_on_all_ranks(out)
      identical = identical .and. same_here
      if (method == 'dense') then
        do i = 1, n
          mean = 0
          do r = 0, nranks - 1
            mean = mean + gradient_value(r, i, c)
          end do
          mean = mean / nranks
          values_ok = values_ok .and. abs(out(i) - mean) <= 1e-5 * (1 + abs(mean))
        end do
      else if (method /= 's2') then
        ! Sparse: not empty and far from dense (each method's own bound is tested in C++).
        values_ok = values_ok .and. count(abs(out) > 0) > 0 .and. &
                    count(abs(out) > 0) <= 2 * nranks * 40
      end if
    end do
    call check(codes_ok, method // ': every reduce succeeds')
    call check(same, method // ': in place equals out of place')
    call check(identical, method // ': the same bits on every rank')
    call check(values_ok, method // ': dense is the mean, sparse keeps at most 2 P k entries')
    code_a = oktopk_get_stats(a, stats)
    call check(code_a == OKTOPK_SUCCESS .and. stats%iteration == 5 .and. stats%k == 40 .and. &
               (nranks == 1 .or. stats%bytes_sent > 0), method // ': stats')
    call check(phases_add_up(a, stats), method // ': the phases add up to the call''s stats')

    write (path, '(3a, i0, a, i0, a)') 'fortran_state_', method, '_np', nranks, '_rank', rank, &
                                       '.okst'
    call fill(grad, rank, 6)
    code_a = oktopk_save_state(a, trim(path))
    code_b = oktopk_reduce(a, grad, first)
    code_c = oktopk_restore_state(a, trim(path))
    code_d = oktopk_reduce(a, grad, out)
    call check(all([code_a, code_b, code_c, code_d] == OKTOPK_SUCCESS), &
               method // ': state round trip')
    call check(all(bits(out) == bits(first)), &
               method // ': the restored handle repeats its call bit for bit')
    open (unit=10, file=trim(path), status='old', iostat=ierr)
    if (ierr == 0) close (10, status='delete')
    code_a = oktopk_destroy(a)
    code_b = oktopk_destroy(b)
    call check(code_a == OKTOPK_SUCCESS .and. code_b == OKTOPK_SUCCESS, method // ': destroy')
  end subroutine test_method

  ! Every method on real(8) arrays: results the same bits on every rank, in place equal to out
  ! of place, dense the mean to float64 rounding, sparse results of the expected size.
  subroutine test_real8(method)
    character(len=*), intent(in) :: method
    type(oktopk_handle) :: a, b
    real(c_double), allocatable :: grad(:), out(:), inplace(:)
    integer(c_int32_t), allocatable :: mine(:), lo(:), hi(:)
    real(c_double) :: mean
    logical :: codes_ok, same, identical, values_ok
    integer :: c, r, code_a, code_b, dtype
    integer(c_int64_t) :: i

    code_a = oktopk_create(MPI_COMM_WORLD, method, n, 'density=0.02', a, dtype=OKTOPK_FLOAT64)
    code_b = oktopk_create(MPI_COMM_WORLD, method, n, 'density=0.02', b, OKTOPK_FLOAT64)
    call check(code_a == OKTOPK_SUCCESS .and. code_b == OKTOPK_SUCCESS, &
               method // ' real(8): create with dtype=OKTOPK_FLOAT64')
    code_a = oktopk_get_dtype(a, dtype)
    call check(code_a == OKTOPK_SUCCESS .and. dtype == OKTOPK_FLOAT64, &
               method // ' real(8): get_dtype')
    ! The results' bits as 32-bit halves, reduced as identical_on_all_ranks reduces them.
    allocate(grad(n), out(n), inplace(n), mine(2 * n), lo(2 * n), hi(2 * n))
    codes_ok = .true.; same = .true.; identical = .true.; values_ok = .true.
    do c = 1, 4
      do i = 1, n
        grad(i) = real(gradient_value(rank, i, c), c_double)
      end do
      inplace = grad
      code_a = oktopk_reduce(a, grad, out)
      code_b = oktopk_reduce_inplace(b, inplace)
      codes_ok = codes_ok .and. code_a == OKTOPK_SUCCESS .and. code_b == OKTOPK_SUCCESS
      same = same .and. all(transfer(out, 0_c_int64_t, n) == transfer(inplace, 0_c_int64_t, n))
      mine = transfer(out, 0_c_int32_t, 2 * int(n))
      call mpi_allreduce(mine, lo, 2 * int(n), MPI_INTEGER4, MPI_MIN, MPI_COMM_WORLD, ierr)
      call mpi_allreduce(mine, hi, 2 * int(n), MPI_INTEGER4, MPI_MAX, MPI_COMM_WORLD, ierr)
      identical = identical .and. all(lo == hi)
      if (method == 'dense') then
        do i = 1, n
          mean = 0
          do r = 0, nranks - 1
            mean = mean + real(gradient_value(r, i, c), c_double)
          end do
          mean = mean / nranks
          values_ok = values_ok .and. abs(out(i) - mean) <= 1d-13 * (1 + abs(mean))
        end do
      else if (method /= 's2') then
        values_ok = values_ok .and. count(abs(out) > 0) > 0 .and. &
                    count(abs(out) > 0) <= 2 * nranks * 40
      end if
    end do
    call check(codes_ok, method // ' real(8): every reduce succeeds')
    call check(same .and. identical, &
               method // ' real(8): in place equals out of place, the same bits on every rank')
    call check(values_ok, &
               method // ' real(8): dense is the mean, sparse keeps at most 2 P k entries')
    code_a = oktopk_destroy(a)
    code_b = oktopk_destroy(b)
  end subroutine test_real8

  ! real(4) arrays for a real(8) handle on one rank: every rank fails, and the handle still
  ! works; an unknown dtype fails every rank.
  subroutine test_kind_errors()
    type(oktopk_handle) :: h
    real(c_double), allocatable :: grad(:), out(:)
    real(c_float), allocatable :: single(:)
    integer :: code
    character(len=:), allocatable :: message

    allocate(grad(n), out(n), single(n))
    grad = 1
    single = 1
    code = oktopk_create(MPI_COMM_WORLD, 'topka', n, '', h, OKTOPK_FLOAT64)
    call check(code == OKTOPK_SUCCESS, 'create a real(8) handle')
    if (rank == 0) then
      code = oktopk_reduce_inplace(h, single)
    else
      code = oktopk_reduce(h, grad, out)
    end if
    message = oktopk_last_error()
    call check(code == OKTOPK_ERROR_INVALID_ARGUMENT .and. &
               (rank /= 0 .or. index(message, 'the arrays are OKTOPK_FLOAT32, the handle''s ' // &
                                             'gradients OKTOPK_FLOAT64') > 0), &
               'real(4) arrays on one rank for a real(8) handle: an error on every rank')
    code = oktopk_reduce(h, grad, out)
    call check(code == OKTOPK_SUCCESS, 'the real(8) handle works after the kind error')
    code = oktopk_destroy(h)
    code = oktopk_create(MPI_COMM_WORLD, 'topka', n, '', h, 5)
    message = oktopk_last_error()
    call check(code == OKTOPK_ERROR_INVALID_ARGUMENT .and. index(message, 'dtype must be') > 0, &
               'an unknown dtype: OKTOPK_ERROR_INVALID_ARGUMENT')
  end subroutine test_kind_errors

  subroutine test_errors()
    type(oktopk_handle) :: h
    real(c_float), allocatable :: grad(:), out(:), short(:)
    integer :: code
    character(len=:), allocatable :: message

    allocate(grad(n), out(n), short(n - 1))
    call check(oktopk_create(MPI_COMM_WORLD, 'oktopk', n, '', h) == OKTOPK_SUCCESS, &
               'create for the error tests')
    call fill(grad, rank, 1)
    if (rank == nranks - 1) grad(5) = ieee_value(grad(5), ieee_quiet_nan)
    code = oktopk_reduce(h, grad, out)
    message = oktopk_last_error()
    call check(code == OKTOPK_ERROR_INVALID_ARGUMENT .and. index(message, 'NaN or Inf') > 0, &
               'NaN on one rank: OKTOPK_ERROR_INVALID_ARGUMENT on every rank')
    call fill(grad, rank, 1)
    code = oktopk_reduce(h, grad, out)
    call check(code == OKTOPK_SUCCESS, 'the handle works after NaN')
    ! A short array on rank 0 only: the length error on every rank, nothing read past its end.
    if (rank == 0) then
      code = oktopk_reduce(h, short, out)
    else
      code = oktopk_reduce(h, grad, out)
    end if
    message = oktopk_last_error()
    call check(code == OKTOPK_ERROR_INVALID_ARGUMENT .and. index(message, 'length') > 0, &
               'a short array on one rank: OKTOPK_ERROR_INVALID_ARGUMENT on every rank')
    code = oktopk_destroy(h)
    call check(code == OKTOPK_SUCCESS, 'destroy')

    code = oktopk_create(MPI_COMM_WORLD, 'topka', n + merge(rank, 0, nranks > 1), '', h)
    message = oktopk_last_error()
    call check(nranks == 1 .or. (code == OKTOPK_ERROR_INVALID_ARGUMENT .and. &
               index(message, 'make_sparse_allreduce') > 0), &
               'mismatched n: OKTOPK_ERROR_INVALID_ARGUMENT on every rank')
    if (code == OKTOPK_SUCCESS) code = oktopk_destroy(h)
    code = oktopk_create(MPI_COMM_WORLD, 'nosuch', n, '', h)
    message = oktopk_last_error()
    call check(code == OKTOPK_ERROR_INVALID_ARGUMENT .and. &
               index(message, "unknown algorithm 'nosuch'") > 0, 'unknown method')
  end subroutine test_errors

  ! A fused buffer of 30 rows of 40 reals, then 800 dense reals: s2 averages the dense part
  ! exactly, other methods give what they give without the layout; segment counts add up.
  subroutine test_layout(method)
    character(len=*), intent(in) :: method
    integer(c_int64_t), parameter :: rows_length = 1200
    type(oktopk_handle) :: fused, plain
    type(oktopk_segment_stats) :: rows, rest
    real(c_float), allocatable :: grad(:), with(:), without(:)
    real(c_float) :: mean
    integer(c_int64_t) :: segments, i
    integer :: c, r, code_a, code_b, code_c
    logical :: codes_ok, values_ok, counts_ok

    code_a = oktopk_create_with_layout(MPI_COMM_WORLD, method, n, 'density=0.02', &
                                       [rows_length, n - rows_length], &
                                       [integer(c_int) :: OKTOPK_SEGMENT_ROWS, &
                                        OKTOPK_SEGMENT_DENSE], [40_c_int64_t, 1_c_int64_t], fused)
    code_b = oktopk_create(MPI_COMM_WORLD, method, n, 'density=0.02', plain)
    code_c = oktopk_get_num_segments(fused, segments)
    call check(all([code_a, code_b, code_c] == OKTOPK_SUCCESS) .and. segments == 2, &
               method // ' with a layout: create, two segments')
    allocate(grad(n), with(n), without(n))
    codes_ok = .true.; values_ok = .true.; counts_ok = .true.
    do c = 1, 4
      call fill(grad, rank, c)
      ! Rows 1, 2, ... of 40: a rank's gradient touches one row in five.
      do i = 1, rows_length
        if (mod((i - 1) / 40 + rank * 3 + c, 5_c_int64_t) /= 0) grad(i) = 0
      end do
      code_a = oktopk_reduce(fused, grad, with)
      code_b = oktopk_reduce(plain, grad, without)
      codes_ok = codes_ok .and. code_a == OKTOPK_SUCCESS .and. code_b == OKTOPK_SUCCESS
      if (method == 's2') then
        do i = rows_length + 1, n
          mean = 0
          do r = 0, nranks - 1
            mean = mean + gradient_value(r, i, c)
          end do
          mean = mean / nranks
          values_ok = values_ok .and. abs(with(i) - mean) <= 1e-5 * (1 + abs(mean))
        end do
      else
        values_ok = values_ok .and. all(bits(with) == bits(without))
      end if
      code_a = oktopk_get_segment_stats(fused, 1_c_int64_t, rows)
      code_b = oktopk_get_segment_stats(fused, 2_c_int64_t, rest)
      counts_ok = counts_ok .and. code_a == OKTOPK_SUCCESS .and. code_b == OKTOPK_SUCCESS .and. &
                  rows%kind == OKTOPK_SEGMENT_ROWS .and. rows%row_width == 40 .and. &
                  rest%kind == OKTOPK_SEGMENT_DENSE .and. rest%offset == rows_length .and. &
                  rows%nonzeros == count(abs(with(:rows_length)) > 0) .and. &
                  rows%nonzeros + rest%nonzeros == count(abs(with) > 0)
    end do
    call check(codes_ok, method // ' with a layout: every reduce succeeds')
    if (method == 's2') then
      call check(values_ok, method // ' with a layout: the dense segment is the exact mean')
    else
      call check(values_ok, method // ' with a layout: the same bits as without one')
    end if
    call check(counts_ok, method // ' with a layout: segment stats add up to the output')
    code_a = oktopk_destroy(fused)
    code_b = oktopk_destroy(plain)
  end subroutine test_layout

  subroutine test_layout_errors()
    type(oktopk_handle) :: h
    integer(c_int64_t) :: second
    integer :: code
    character(len=:), allocatable :: message
    character(len=64) :: expected

    write (expected, '(a, i0, a)') 'oktopk_create_typed: rank ', nranks - 1, ': '
    second = merge(-1900_c_int64_t, 1900_c_int64_t, rank == nranks - 1)
    code = oktopk_create_with_layout(MPI_COMM_WORLD, 's2', n, '', [100_c_int64_t, second], &
                                     [integer(c_int) :: OKTOPK_SEGMENT_ROWS, &
                                      OKTOPK_SEGMENT_DENSE], [10_c_int64_t, 1_c_int64_t], h)
    message = oktopk_last_error()
    call check(code == OKTOPK_ERROR_INVALID_ARGUMENT .and. &
               index(message, trim(expected) // ' segment 1: length must be >= 0') == 1, &
               'a negative length on the last rank: the error on every rank')
    code = oktopk_create_with_layout(MPI_COMM_WORLD, 's2', n, '', &
                                     [100_c_int64_t, 1900_c_int64_t], &
                                     [integer(c_int) :: OKTOPK_SEGMENT_ROWS], &
                                     [10_c_int64_t, 1_c_int64_t], h)
    message = oktopk_last_error()
    call check(code == OKTOPK_ERROR_INVALID_ARGUMENT .and. &
               index(message, 'kinds is NULL with num_segments = 2') > 0, &
               'kinds of another size than lengths')
    code = oktopk_create_with_layout(MPI_COMM_WORLD, 's2', n, '', &
                                     [100_c_int64_t, 1800_c_int64_t], &
                                     [integer(c_int) :: OKTOPK_SEGMENT_ROWS, &
                                      OKTOPK_SEGMENT_DENSE], [10_c_int64_t, 1_c_int64_t], h)
    message = oktopk_last_error()
    call check(code == OKTOPK_ERROR_INVALID_ARGUMENT .and. &
               index(message, 'the segments cover [0, 1900), not [0, n = 2000)') > 0, &
               'segments short of n')
  end subroutine test_layout_errors

  ! oktopk_reduce_on_stream: with stream 0 in a CPU build, the bits of oktopk_reduce, from arrays
  ! and from addresses; a stream on the last rank fails every rank, naming it. In a GPU build,
  ! host arrays are refused on every rank.
  subroutine test_on_stream()
    type(oktopk_handle) :: h, twin
    real(c_float), allocatable, target :: grad(:), out(:), expected(:)
    integer :: code, twin_code, device, c
    integer(c_intptr_t) :: stream
    logical :: same
    character(len=:), allocatable :: message
    character(len=64) :: bad_rank
    allocate(grad(n), out(n), expected(n))
    call check(oktopk_get_device(device) == OKTOPK_SUCCESS .and. device >= -1, 'get_device')
    code = oktopk_create(MPI_COMM_WORLD, 'oktopk', n, 'density=0.02', h)
    twin_code = oktopk_create(MPI_COMM_WORLD, 'oktopk', n, 'density=0.02', twin)
    call check(code == OKTOPK_SUCCESS .and. twin_code == OKTOPK_SUCCESS, &
               'on_stream: create a handle and its twin')
    call fill(grad, rank, 0)
    if (device >= 0) then
      code = oktopk_reduce_on_stream(h, grad, out, 0_c_intptr_t)
      message = oktopk_last_error()
      call check(code == OKTOPK_ERROR_INVALID_ARGUMENT .and. &
                 index(message, 'rank 0: grad is pageable host memory') > 0, &
                 'on_stream (GPU build): host arrays refused on every rank')
    else
      same = .true.
      do c = 1, 3
        call fill(grad, rank, c)
        ! Calls as statements of their own: an operand of .and. may be left unevaluated.
        if (c < 3) then
          code = oktopk_reduce_on_stream(h, grad, out, 0_c_intptr_t)
        else
          code = oktopk_reduce_on_stream(h, OKTOPK_FLOAT32, c_loc(grad), c_loc(out), 0_c_intptr_t)
        end if
        twin_code = oktopk_reduce(twin, grad, expected)
        same = same .and. code == OKTOPK_SUCCESS .and. twin_code == OKTOPK_SUCCESS .and. &
               all(transfer(out, 0_c_int32_t, n) == transfer(expected, 0_c_int32_t, n))
      end do
      call check(same, 'on_stream (CPU build), arrays and addresses: the bits of oktopk_reduce')
      stream = 0
      if (rank == nranks - 1) stream = 64
      code = oktopk_reduce_on_stream(h, grad, out, stream)
      message = oktopk_last_error()
      write (bad_rank, '(a, i0, a)') 'oktopk_reduce_on_stream: rank ', nranks - 1, ': '
      call check(code == OKTOPK_ERROR_INVALID_ARGUMENT .and. index(message, trim(bad_rank)) > 0 &
                 .and. index(message, 'a stream was given') > 0, &
                 'on_stream (CPU build): a stream on the last rank fails every rank, naming it')
    end if
    code = oktopk_destroy(h)
    code = oktopk_destroy(twin)
  end subroutine test_on_stream

  ! reduce_scatter: the shard is the slice of a twin's reduce, bit for bit (oktopk), with equal
  ! shards and with given offsets; a shard of the wrong size on one rank fails on every rank.
  subroutine test_reduce_scatter()
    type(oktopk_handle) :: a, b
    real(c_float), allocatable :: grad(:), out(:), shard(:)
    integer(c_int64_t), allocatable :: offsets(:)
    integer(c_int64_t) :: first, last
    integer :: c, r, code, code_a, code_b
    logical :: ok, same
    character(len=:), allocatable :: message
    type(oktopk_stats) :: stats_a, stats_b
    code_a = oktopk_create(MPI_COMM_WORLD, 'oktopk', n, 'density=0.02', a)
    code_b = oktopk_create(MPI_COMM_WORLD, 'oktopk', n, 'density=0.02', b)
    call check(code_a == OKTOPK_SUCCESS .and. code_b == OKTOPK_SUCCESS, &
               'reduce_scatter: create two oktopk handles')
    allocate(grad(n), out(n), offsets(nranks + 1))
    ! Given offsets: the last rank's shard the largest.
    do r = 0, nranks - 1
      offsets(r + 1) = r * (n / (2 * nranks))
    end do
    offsets(nranks + 1) = n
    ok = .true.
    same = .true.
    do c = 1, 4
      call fill(grad, rank, c)
      if (mod(c, 2) == 1) then
        first = rank * n / nranks
        last = (rank + 1) * n / nranks
      else
        first = offsets(rank + 1)
        last = offsets(rank + 2)
      end if
      allocate(shard(last - first))
      code_a = oktopk_reduce(a, grad, out)
      if (mod(c, 2) == 1) then
        code_b = oktopk_reduce_scatter(b, grad, shard)
      else
        code_b = oktopk_reduce_scatter(b, grad, shard, offsets)
      end if
      ok = ok .and. code_a == OKTOPK_SUCCESS .and. code_b == OKTOPK_SUCCESS
      same = same .and. all(bits(shard) == bits(out(first + 1:last)))
      deallocate(shard)
    end do
    call check(ok, 'reduce_scatter: every call succeeds')
    call check(same, 'reduce_scatter: the shards are reduce''s slices, bit for bit')
    code_a = oktopk_get_stats(a, stats_a)
    code_b = oktopk_get_stats(b, stats_b)
    call check(code_a == OKTOPK_SUCCESS .and. code_b == OKTOPK_SUCCESS .and. &
               stats_a%reduce_scatter == 0 .and. stats_b%reduce_scatter == 1, &
               'reduce_scatter: stats say which call was a reduce-scatter')
    allocate(shard(merge(1, 0, rank == nranks - 1) + (rank + 1) * n / nranks - rank * n / nranks))
    code = oktopk_reduce_scatter(b, grad, shard)
    message = oktopk_last_error()
    call check(code == OKTOPK_ERROR_INVALID_ARGUMENT .and. &
               index(message, 'reduce_scatter: rank') > 0, &
               'reduce_scatter: a wrong shard size on one rank fails on every rank')
    code_a = oktopk_destroy(a)
    code_b = oktopk_destroy(b)
    call check(code_a == OKTOPK_SUCCESS .and. code_b == OKTOPK_SUCCESS, 'reduce_scatter: destroy')
  end subroutine test_reduce_scatter

end program test_fortran
