! SPDX-License-Identifier: BSD-3-Clause
! The Fortran interface to OkTopk, over the C interface (include/oktopk/c_api.h). Communicators
! are the integer handles of `use mpi`; every function returns the C interface's code
! (OKTOPK_SUCCESS = 0) and oktopk_last_error() gives the message of the last failure.
module oktopk
  use, intrinsic :: iso_c_binding, only: c_ptr, c_null_ptr, c_char, c_null_char, c_int, &
                                         c_int32_t, c_int64_t, c_float, c_double, c_size_t, &
                                         c_intptr_t, c_associated, c_f_pointer, c_loc
  implicit none
  private

  integer, parameter, public :: OKTOPK_SUCCESS = 0
  integer, parameter, public :: OKTOPK_ERROR_INVALID_ARGUMENT = 1
  integer, parameter, public :: OKTOPK_ERROR_RUNTIME = 2
  integer, parameter, public :: OKTOPK_ERROR_OUT_OF_MEMORY = 3
  !> Segment kinds of a fused buffer (oktopk_create_with_layout).
  integer, parameter, public :: OKTOPK_SEGMENT_DENSE = 0
  integer, parameter, public :: OKTOPK_SEGMENT_ROWS = 1
  !> Gradient types (the dtype argument of oktopk_create): real(4) and real(8) arrays.
  integer, parameter, public :: OKTOPK_FLOAT32 = 0
  integer, parameter, public :: OKTOPK_FLOAT64 = 1

  !> A sparse allreduce handle; null until oktopk_create succeeds.
  type, public :: oktopk_handle
    type(c_ptr) :: ptr = c_null_ptr
  end type oktopk_handle

  !> Statistics of the last reduce call on this rank (the C struct oktopk_stats).
  type, public, bind(c) :: oktopk_stats
    integer(c_int64_t) :: iteration, k, local_selected, global_selected
    integer(c_int64_t) :: bytes_sent, bytes_received, messages_sent, messages_received
    real(c_double) :: seconds
    real(c_float) :: local_threshold, global_threshold
    integer(c_int32_t) :: dense
    integer(c_int64_t) :: bytes_sent_between_nodes, bytes_received_between_nodes
    integer(c_int32_t) :: selected_nothing, reduce_scatter
  end type oktopk_stats

  !> One phase of the last reduce call on this rank (the C struct oktopk_phase_stats); name is
  !> NUL-terminated.
  type, public, bind(c) :: oktopk_phase_stats
    character(kind=c_char) :: name(32)
    real(c_double) :: seconds
    integer(c_int64_t) :: bytes_sent, bytes_received, messages_sent, messages_received
    integer(c_int64_t) :: bytes_sent_between_nodes, bytes_received_between_nodes
  end type oktopk_phase_stats

  !> One segment of a handle's layout and its non-zeros in the last output (the C struct
  !> oktopk_segment_stats). name is a C string: "" for handles made from Fortran.
  type, public, bind(c) :: oktopk_segment_stats
    integer(c_int64_t) :: offset, length, row_width, nonzeros
    integer(c_int32_t) :: kind
    type(c_ptr) :: name
  end type oktopk_segment_stats

  public :: oktopk_initialize, oktopk_finalize, oktopk_create, oktopk_create_with_layout, &
            oktopk_destroy, oktopk_reduce, oktopk_reduce_inplace, oktopk_get_stats, &
            oktopk_get_num_segments, oktopk_get_segment_stats, oktopk_get_num_phases, &
            oktopk_get_phase_stats, oktopk_save_state, &
            oktopk_restore_state, oktopk_get_dtype, oktopk_last_error, oktopk_version, &
            oktopk_reduce_on_stream, oktopk_get_device, oktopk_reduce_scatter

  !> Collective. out = the average over ranks of the sparsified gradients: real(4) arrays for
  !> a handle made with dtype = OKTOPK_FLOAT32 (the default), real(8) ones for OKTOPK_FLOAT64.
  interface oktopk_reduce
    module procedure reduce_real4, reduce_real8
  end interface oktopk_reduce

  !> Collective. oktopk_reduce with the result written over the gradient.
  interface oktopk_reduce_inplace
    module procedure reduce_inplace_real4, reduce_inplace_real8
  end interface oktopk_reduce_inplace

  !> Collective. oktopk_reduce on the caller's CUDA or HIP stream (the C interface's
  !> oktopk_reduce_on_stream): `stream` is the stream as an integer(c_intptr_t), the kind of
  !> CUDA Fortran's cuda_stream_kind and of OpenACC's acc_get_cuda_stream, 0 for the default
  !> stream (and the only value a CPU build takes). The work runs on that stream after what was
  !> queued there before, and the stream has finished it on return. grad and out are device
  !> or managed memory of the handle's GPU (oktopk_get_device), as real arrays inside OpenACC's
  !> `host_data use_device(grad, out)`, or as addresses (type(c_ptr), CUDA Fortran's c_devloc)
  !> with the dtype given. A bad argument on any rank fails the call on every rank, naming it.
  interface oktopk_reduce_on_stream
    module procedure reduce_on_stream_real4, reduce_on_stream_real8, reduce_on_stream_address
  end interface oktopk_reduce_on_stream

  !> Collective. For sharded data parallelism: shard receives this rank's part, entries
  !> shard_offsets(rank + 1) + 1 to shard_offsets(rank + 2) (1-based), of what oktopk_reduce
  !> would write on the same gradients, with the same error feedback. shard_offsets (optional):
  !> the P + 1 0-based boundaries from 0 to n, the same on every rank; absent for equal shards
  !> ([r*n/P, (r+1)*n/P)). Methods "oktopk", "topka", "topkdsa", "gaussiank" and "dense";
  !> "gtopk", "s2", a wrong size(shard) or bad offsets on any rank fail on every rank (the C
  !> interface's oktopk_reduce_scatter_typed).
  interface oktopk_reduce_scatter
    module procedure reduce_scatter_real4, reduce_scatter_real8
  end interface oktopk_reduce_scatter

  interface address_of
    module procedure address_of_real4, address_of_real8
  end interface address_of

  interface
    function c_initialize(argc, argv) result(code) bind(c, name="oktopk_initialize")
      import :: c_ptr, c_int
      type(c_ptr), value :: argc, argv
      integer(c_int) :: code
    end function c_initialize

    function c_finalize() result(code) bind(c, name="oktopk_finalize")
      import :: c_int
      integer(c_int) :: code
    end function c_finalize

    function c_create_typed_f(comm, algorithm, n, dtype, options, num_segments, lengths, kinds, &
                              row_widths, names, handle) result(code) &
        bind(c, name="oktopk_create_typed_f")
      import :: c_int, c_char, c_int64_t, c_ptr
      integer(c_int), value :: comm, dtype
      character(kind=c_char), dimension(*), intent(in) :: algorithm, options
      integer(c_int64_t), value :: n, num_segments
      type(c_ptr), value :: lengths, kinds, row_widths, names
      type(c_ptr), intent(out) :: handle
      integer(c_int) :: code
    end function c_create_typed_f

    function c_get_dtype(handle, dtype, residual_dtype) result(code) &
        bind(c, name="oktopk_get_dtype")
      import :: c_ptr, c_int
      type(c_ptr), value :: handle
      integer(c_int), intent(out) :: dtype, residual_dtype
      integer(c_int) :: code
    end function c_get_dtype

    function c_get_num_segments(handle, num_segments) result(code) &
        bind(c, name="oktopk_get_num_segments")
      import :: c_ptr, c_int, c_int64_t
      type(c_ptr), value :: handle
      integer(c_int64_t), intent(out) :: num_segments
      integer(c_int) :: code
    end function c_get_num_segments

    function c_get_segment_stats(handle, index, stats) result(code) &
        bind(c, name="oktopk_get_segment_stats")
      import :: c_ptr, c_int, c_int64_t, oktopk_segment_stats
      type(c_ptr), value :: handle
      integer(c_int64_t), value :: index
      type(oktopk_segment_stats), intent(out) :: stats
      integer(c_int) :: code
    end function c_get_segment_stats

    function c_get_num_phases(handle, num_phases) result(code) &
        bind(c, name="oktopk_get_num_phases")
      import :: c_ptr, c_int, c_int64_t
      type(c_ptr), value :: handle
      integer(c_int64_t), intent(out) :: num_phases
      integer(c_int) :: code
    end function c_get_num_phases

    function c_get_phase_stats(handle, index, phase) result(code) &
        bind(c, name="oktopk_get_phase_stats")
      import :: c_ptr, c_int, c_int64_t, oktopk_phase_stats
      type(c_ptr), value :: handle
      integer(c_int64_t), value :: index
      type(oktopk_phase_stats), intent(out) :: phase
      integer(c_int) :: code
    end function c_get_phase_stats

    function c_destroy(handle) result(code) bind(c, name="oktopk_destroy")
      import :: c_ptr, c_int
      type(c_ptr), value :: handle
      integer(c_int) :: code
    end function c_destroy

    function c_reduce_typed(handle, dtype, grad, out) result(code) &
        bind(c, name="oktopk_reduce_typed")
      import :: c_ptr, c_int
      type(c_ptr), value :: handle, grad, out
      integer(c_int), value :: dtype
      integer(c_int) :: code
    end function c_reduce_typed

    function c_reduce_scatter_typed(handle, dtype, grad, shard, shard_length, offsets, &
                                    num_offsets) result(code) &
        bind(c, name="oktopk_reduce_scatter_typed")
      import :: c_ptr, c_int, c_int64_t
      type(c_ptr), value :: handle, grad, shard, offsets
      integer(c_int), value :: dtype
      integer(c_int64_t), value :: shard_length, num_offsets
      integer(c_int) :: code
    end function c_reduce_scatter_typed

    function c_reduce_on_stream(handle, dtype, grad, out, stream) result(code) &
        bind(c, name="oktopk_reduce_on_stream")
      import :: c_ptr, c_int
      type(c_ptr), value :: handle, grad, out, stream
      integer(c_int), value :: dtype
      integer(c_int) :: code
    end function c_reduce_on_stream

    function c_get_device(device) result(code) bind(c, name="oktopk_get_device")
      import :: c_int
      integer(c_int), intent(out) :: device
      integer(c_int) :: code
    end function c_get_device

    function c_describe(handle, algorithm, n, k) result(code) bind(c, name="oktopk_describe")
      import :: c_ptr, c_int, c_int64_t
      type(c_ptr), value :: handle, algorithm, k
      integer(c_int64_t), intent(out) :: n
      integer(c_int) :: code
    end function c_describe

    function c_get_stats(handle, stats) result(code) bind(c, name="oktopk_get_stats")
      import :: c_ptr, c_int, oktopk_stats
      type(c_ptr), value :: handle
      type(oktopk_stats), intent(out) :: stats
      integer(c_int) :: code
    end function c_get_stats

    function c_save_state(handle, path) result(code) bind(c, name="oktopk_save_state")
      import :: c_ptr, c_int, c_char
      type(c_ptr), value :: handle
      character(kind=c_char), dimension(*), intent(in) :: path
      integer(c_int) :: code
    end function c_save_state

    function c_restore_state(handle, path) result(code) bind(c, name="oktopk_restore_state")
      import :: c_ptr, c_int, c_char
      type(c_ptr), value :: handle
      character(kind=c_char), dimension(*), intent(in) :: path
      integer(c_int) :: code
    end function c_restore_state

    function c_last_error() result(message) bind(c, name="oktopk_last_error")
      import :: c_ptr
      type(c_ptr) :: message
    end function c_last_error

    function c_version() result(version) bind(c, name="oktopk_version")
      import :: c_ptr
      type(c_ptr) :: version
    end function c_version

    function c_strlen(s) result(length) bind(c, name="strlen")
      import :: c_ptr, c_size_t
      type(c_ptr), value :: s
      integer(c_size_t) :: length
    end function c_strlen
  end interface

contains

  ! A NUL-terminated copy of a Fortran string, trailing blanks removed.
  pure function c_string(text) result(s)
    character(len=*), intent(in) :: text
    character(kind=c_char, len=len_trim(text) + 1) :: s
    s = trim(text) // c_null_char
  end function c_string

  ! A Fortran copy of a NUL-terminated C string.
  function f_string(s) result(text)
    type(c_ptr), intent(in) :: s
    character(len=:), allocatable :: text
    character(kind=c_char), pointer :: chars(:)
    integer :: i, length
    length = int(c_strlen(s))
    call c_f_pointer(s, chars, [length])
    allocate(character(len=length) :: text)
    do i = 1, length
      text(i:i) = chars(i)
    end do
  end function f_string

  !> Initialises Kokkos unless it already is (then oktopk_finalize leaves it alone).
  integer function oktopk_initialize() result(code)
    code = int(c_initialize(c_null_ptr, c_null_ptr))
  end function oktopk_initialize

  !> Finalises Kokkos if oktopk_initialize initialised it; every handle must be destroyed.
  integer function oktopk_finalize() result(code)
    code = int(c_finalize())
  end function oktopk_finalize

  ! The dtype argument's value: OKTOPK_FLOAT32 when absent.
  integer(c_int) function dtype_or_float32(dtype) result(value)
    integer, intent(in), optional :: dtype
    value = int(OKTOPK_FLOAT32, c_int)
    if (present(dtype)) value = int(dtype, c_int)
  end function dtype_or_float32

  !> Collective. A handle for gradients of n reals running `algorithm` over a duplicate of
  !> `comm`; `options` holds key=value settings separated by spaces or commas. dtype (optional)
  !> is OKTOPK_FLOAT32 (real(4) arrays, the default) or OKTOPK_FLOAT64 (real(8) arrays); the
  !> C interface checks it (its 16-bit types make handles this module has no arrays for).
  integer function oktopk_create(comm, algorithm, n, options, handle, dtype) result(code)
    integer, intent(in) :: comm
    character(len=*), intent(in) :: algorithm
    integer(c_int64_t), intent(in) :: n
    character(len=*), intent(in) :: options
    type(oktopk_handle), intent(out) :: handle
    integer, intent(in), optional :: dtype
    code = int(c_create_typed_f(int(comm, c_int), c_string(algorithm), n, &
                                dtype_or_float32(dtype), c_string(options), 0_c_int64_t, &
                                c_null_ptr, c_null_ptr, c_null_ptr, c_null_ptr, handle%ptr))
  end function oktopk_create

  !> Collective. oktopk_create for a fused buffer of size(lengths) consecutive segments, the
  !> first at offset 0: segment i holds lengths(i) reals of kind kinds(i), OKTOPK_SEGMENT_DENSE
  !> or OKTOPK_SEGMENT_ROWS (rows of row_widths(i) >= 1 reals; row_widths(i) is ignored for
  !> dense segments); the lengths must sum to n. Segments are unnamed. kinds and row_widths must
  !> have size(lengths) elements: one of another size reaches the C interface as NULL, which
  !> reports it ("kinds is NULL with num_segments = ...") on every rank, as it does any bad
  !> segment on any rank. dtype as for oktopk_create.
  integer function oktopk_create_with_layout(comm, algorithm, n, options, lengths, kinds, &
                                             row_widths, handle, dtype) result(code)
    integer, intent(in) :: comm
    character(len=*), intent(in) :: algorithm
    integer(c_int64_t), intent(in) :: n
    character(len=*), intent(in) :: options
    integer(c_int64_t), intent(in), target, contiguous :: lengths(:)
    integer(c_int), intent(in), target, contiguous :: kinds(:)
    integer(c_int64_t), intent(in), target, contiguous :: row_widths(:)
    type(oktopk_handle), intent(out) :: handle
    integer, intent(in), optional :: dtype
    type(c_ptr) :: lengths_ptr, kinds_ptr, widths_ptr
    lengths_ptr = c_null_ptr
    kinds_ptr = c_null_ptr
    widths_ptr = c_null_ptr
    ! c_loc of a zero-sized array is not a valid address; NULL is the C interface's empty array.
    if (size(lengths) > 0) then
      lengths_ptr = c_loc(lengths)
      if (size(kinds) == size(lengths)) kinds_ptr = c_loc(kinds)
      if (size(row_widths) == size(lengths)) widths_ptr = c_loc(row_widths)
    end if
    code = int(c_create_typed_f(int(comm, c_int), c_string(algorithm), n, &
                                dtype_or_float32(dtype), c_string(options), &
                                size(lengths, kind=c_int64_t), lengths_ptr, kinds_ptr, &
                                widths_ptr, c_null_ptr, handle%ptr))
  end function oktopk_create_with_layout

  !> The handle's gradient type (OKTOPK_FLOAT32 or OKTOPK_FLOAT64).
  integer function oktopk_get_dtype(handle, dtype) result(code)
    type(oktopk_handle), intent(in) :: handle
    integer, intent(out) :: dtype
    integer(c_int) :: value, residual_value
    value = -1
    code = int(c_get_dtype(handle%ptr, value, residual_value))
    dtype = int(value)
  end function oktopk_get_dtype

  !> Frees the handle and nulls it (a null handle is allowed).
  integer function oktopk_destroy(handle) result(code)
    type(oktopk_handle), intent(inout) :: handle
    code = int(c_destroy(handle%ptr))
    handle%ptr = c_null_ptr
  end function oktopk_destroy

  integer function reduce_real4(handle, grad, out) result(code)
    type(oktopk_handle), intent(in) :: handle
    real(c_float), intent(in), target, contiguous :: grad(:)
    real(c_float), intent(inout), target, contiguous :: out(:)
    code = int(c_reduce_typed(handle%ptr, int(OKTOPK_FLOAT32, c_int), &
                              address_of(handle, grad), &
                              address_of(handle, out)))
  end function reduce_real4

  integer function reduce_real8(handle, grad, out) result(code)
    type(oktopk_handle), intent(in) :: handle
    real(c_double), intent(in), target, contiguous :: grad(:)
    real(c_double), intent(inout), target, contiguous :: out(:)
    code = int(c_reduce_typed(handle%ptr, int(OKTOPK_FLOAT64, c_int), &
                              address_of(handle, grad), &
                              address_of(handle, out)))
  end function reduce_real8

  integer function reduce_inplace_real4(handle, buffer) result(code)
    type(oktopk_handle), intent(in) :: handle
    real(c_float), intent(inout), target, contiguous :: buffer(:)
    type(c_ptr) :: address
    address = address_of(handle, buffer)
    code = int(c_reduce_typed(handle%ptr, int(OKTOPK_FLOAT32, c_int), address, address))
  end function reduce_inplace_real4

  integer function reduce_inplace_real8(handle, buffer) result(code)
    type(oktopk_handle), intent(in) :: handle
    real(c_double), intent(inout), target, contiguous :: buffer(:)
    type(c_ptr) :: address
    address = address_of(handle, buffer)
    code = int(c_reduce_typed(handle%ptr, int(OKTOPK_FLOAT64, c_int), address, address))
  end function reduce_inplace_real8

  integer function reduce_scatter_real4(handle, grad, shard, shard_offsets) result(code)
    type(oktopk_handle), intent(in) :: handle
    real(c_float), intent(in), target, contiguous :: grad(:)
    real(c_float), intent(inout), target, contiguous :: shard(:)
    integer(c_int64_t), intent(in), target, contiguous, optional :: shard_offsets(:)
    type(c_ptr) :: shard_ptr
    shard_ptr = c_null_ptr
    if (size(shard) > 0) shard_ptr = c_loc(shard)
    code = int(c_reduce_scatter_typed(handle%ptr, int(OKTOPK_FLOAT32, c_int), &
                                      address_of(handle, grad), shard_ptr, &
                                      size(shard, kind=c_int64_t), offsets_of(shard_offsets), &
                                      count_of(shard_offsets)))
  end function reduce_scatter_real4

  integer function reduce_scatter_real8(handle, grad, shard, shard_offsets) result(code)
    type(oktopk_handle), intent(in) :: handle
    real(c_double), intent(in), target, contiguous :: grad(:)
    real(c_double), intent(inout), target, contiguous :: shard(:)
    integer(c_int64_t), intent(in), target, contiguous, optional :: shard_offsets(:)
    type(c_ptr) :: shard_ptr
    shard_ptr = c_null_ptr
    if (size(shard) > 0) shard_ptr = c_loc(shard)
    code = int(c_reduce_scatter_typed(handle%ptr, int(OKTOPK_FLOAT64, c_int), &
                                      address_of(handle, grad), shard_ptr, &
                                      size(shard, kind=c_int64_t), offsets_of(shard_offsets), &
                                      count_of(shard_offsets)))
  end function reduce_scatter_real8

  ! The C interface's shard offsets and their count: NULL and 0 (equal shards) when absent or
  ! empty (c_loc of a zero-sized array is not a valid address).
  function offsets_of(shard_offsets) result(address)
    integer(c_int64_t), intent(in), target, contiguous, optional :: shard_offsets(:)
    type(c_ptr) :: address
    address = c_null_ptr
    if (present(shard_offsets)) then
      if (size(shard_offsets) > 0) address = c_loc(shard_offsets)
    end if
  end function offsets_of

  integer(c_int64_t) function count_of(shard_offsets) result(count)
    integer(c_int64_t), intent(in), optional :: shard_offsets(:)
    count = 0
    if (present(shard_offsets)) count = size(shard_offsets, kind=c_int64_t)
  end function count_of

  integer function reduce_on_stream_real4(handle, grad, out, stream) result(code)
    type(oktopk_handle), intent(in) :: handle
    real(c_float), intent(in), target, contiguous :: grad(:)
    real(c_float), intent(inout), target, contiguous :: out(:)
    integer(c_intptr_t), intent(in) :: stream
    code = int(c_reduce_on_stream(handle%ptr, int(OKTOPK_FLOAT32, c_int), &
                                  address_of(handle, grad), address_of(handle, out), &
                                  transfer(stream, c_null_ptr)))
  end function reduce_on_stream_real4

  integer function reduce_on_stream_real8(handle, grad, out, stream) result(code)
    type(oktopk_handle), intent(in) :: handle
    real(c_double), intent(in), target, contiguous :: grad(:)
    real(c_double), intent(inout), target, contiguous :: out(:)
    integer(c_intptr_t), intent(in) :: stream
    code = int(c_reduce_on_stream(handle%ptr, int(OKTOPK_FLOAT64, c_int), &
                                  address_of(handle, grad), address_of(handle, out), &
                                  transfer(stream, c_null_ptr)))
  end function reduce_on_stream_real8

  integer function reduce_on_stream_address(handle, dtype, grad, out, stream) result(code)
    type(oktopk_handle), intent(in) :: handle
    integer, intent(in) :: dtype
    type(c_ptr), intent(in) :: grad, out
    integer(c_intptr_t), intent(in) :: stream
    code = int(c_reduce_on_stream(handle%ptr, int(dtype, c_int), grad, out, &
                                  transfer(stream, c_null_ptr)))
  end function reduce_on_stream_address

  !> The GPU this process's handles run on, or -1 in a build for CPUs only.
  integer function oktopk_get_device(device) result(code)
    integer, intent(out) :: device
    integer(c_int) :: c_device
    c_device = -1
    code = int(c_get_device(c_device))
    device = int(c_device)
  end function oktopk_get_device

  ! An array's address if it holds the handle's n values; otherwise C's NULL, which the
  ! library takes for an empty array and reports on every rank alike ("rank R passed 0 ...")
  ! instead of reading past the end of a short array. Arrays of the wrong kind for the handle
  ! are refused by the C interface, on every rank, naming both types.
  function address_of_real4(handle, a) result(address)
    type(oktopk_handle), intent(in) :: handle
    real(c_float), intent(in), target, contiguous :: a(:)
    type(c_ptr) :: address
    address = c_null_ptr
    if (holds_n(handle, size(a, kind=c_int64_t))) address = c_loc(a)
  end function address_of_real4

  function address_of_real8(handle, a) result(address)
    type(oktopk_handle), intent(in) :: handle
    real(c_double), intent(in), target, contiguous :: a(:)
    type(c_ptr) :: address
    address = c_null_ptr
    if (holds_n(handle, size(a, kind=c_int64_t))) address = c_loc(a)
  end function address_of_real8

  ! Whether `length` is the handle's n, and n > 0 (c_loc of a zero-sized array is not an
  ! address).
  logical function holds_n(handle, length)
    type(oktopk_handle), intent(in) :: handle
    integer(c_int64_t), intent(in) :: length
    integer(c_int64_t) :: n
    holds_n = .false.
    if (c_describe(handle%ptr, c_null_ptr, n, c_null_ptr) /= OKTOPK_SUCCESS) return
    holds_n = n > 0 .and. length == n
  end function holds_n

  !> Statistics of the handle's last reduce call on this rank.
  integer function oktopk_get_stats(handle, stats) result(code)
    type(oktopk_handle), intent(in) :: handle
    type(oktopk_stats), intent(out) :: stats
    code = int(c_get_stats(handle%ptr, stats))
  end function oktopk_get_stats

  !> The number of segments of the handle's layout (0 without one).
  integer function oktopk_get_num_segments(handle, num_segments) result(code)
    type(oktopk_handle), intent(in) :: handle
    integer(c_int64_t), intent(out) :: num_segments
    code = int(c_get_num_segments(handle%ptr, num_segments))
  end function oktopk_get_num_segments

  !> Segment `index` (from 1) of the handle's layout, with its non-zeros in the last output.
  integer function oktopk_get_segment_stats(handle, index, stats) result(code)
    type(oktopk_handle), intent(in) :: handle
    integer(c_int64_t), intent(in) :: index
    type(oktopk_segment_stats), intent(out) :: stats
    code = int(c_get_segment_stats(handle%ptr, index - 1, stats))
  end function oktopk_get_segment_stats

  !> The number of phases of the last reduce call on this rank (0 before the first).
  integer function oktopk_get_num_phases(handle, num_phases) result(code)
    type(oktopk_handle), intent(in) :: handle
    integer(c_int64_t), intent(out) :: num_phases
    code = int(c_get_num_phases(handle%ptr, num_phases))
  end function oktopk_get_num_phases

  !> Phase `index` (from 1, in the order of the phases' names) of the last reduce call.
  integer function oktopk_get_phase_stats(handle, index, phase) result(code)
    type(oktopk_handle), intent(in) :: handle
    integer(c_int64_t), intent(in) :: index
    type(oktopk_phase_stats), intent(out) :: phase
    code = int(c_get_phase_stats(handle%ptr, index - 1, phase))
  end function oktopk_get_phase_stats

  !> Writes this rank's state to `path` (give every rank its own path). Not collective.
  integer function oktopk_save_state(handle, path) result(code)
    type(oktopk_handle), intent(in) :: handle
    character(len=*), intent(in) :: path
    code = int(c_save_state(handle%ptr, c_string(path)))
  end function oktopk_save_state

  !> Collective. Restores what oktopk_save_state wrote on this rank.
  integer function oktopk_restore_state(handle, path) result(code)
    type(oktopk_handle), intent(inout) :: handle
    character(len=*), intent(in) :: path
    code = int(c_restore_state(handle%ptr, c_string(path)))
  end function oktopk_restore_state

  !> The message of this thread's last failed call.
  function oktopk_last_error() result(message)
    character(len=:), allocatable :: message
    message = f_string(c_last_error())
  end function oktopk_last_error

  !> The library's version, "MAJOR.MINOR.PATCH".
  function oktopk_version() result(version)
    character(len=:), allocatable :: version
    version = f_string(c_version())
  end function oktopk_version

end module oktopk
