# SimGrid SMPI as the MPI of this build (CMakeLists.txt, option ZCOLL_SMPI).
#
# SMPI runs every rank of a job as a thread of one process (smpimain), which loads the program
# with dlopen: so every executable here is linked as a shared object (what smpicxx does), and
# runs only under `smpirun`. The compiler is the ordinary one with SMPI's mpi.h; SMPI's helper
# header (smpicxx's `-include smpi_helpers.h`) is left out on purpose: it redefines malloc/free
# and sleep as macros, which collide with std::free and zcoll's own free() methods. What zcoll
# needs from the simulation instead (the simulated clock, waits that block, the reduction's cost)
# it asks for explicitly where ZCOLL_WITH_SMPI is set (config.h).
#
# Only the core and the benchmarks: no Python extension (the simulation runs C++ programs) and no
# C++ tests (they run over the in-process transport, which needs no simulation).
find_path(SMPI_INCLUDE_DIR smpi/mpi.h)
find_library(SIMGRID_LIBRARY simgrid)
find_program(SMPIRUN_EXECUTABLE smpirun)
if(NOT SMPI_INCLUDE_DIR OR NOT SIMGRID_LIBRARY OR NOT SMPIRUN_EXECUTABLE)
  message(FATAL_ERROR "ZCOLL_SMPI=ON needs SimGrid's SMPI: apt-get install libsimgrid-dev "
                      "(provides smpi/mpi.h, libsimgrid and smpirun)")
endif()
add_library(MPI::MPI_CXX INTERFACE IMPORTED)
target_include_directories(MPI::MPI_CXX SYSTEM INTERFACE ${SMPI_INCLUDE_DIR} ${SMPI_INCLUDE_DIR}/smpi)
target_link_libraries(MPI::MPI_CXX INTERFACE ${SIMGRID_LIBRARY})
set(MPI_FOUND TRUE)
set(ZCOLL_BUILD_PYTHON OFF CACHE BOOL "" FORCE)
set(ZCOLL_BUILD_CPP_TESTS OFF CACHE BOOL "" FORCE)
set(CMAKE_POSITION_INDEPENDENT_CODE ON)
string(APPEND CMAKE_EXE_LINKER_FLAGS " -shared")
message(STATUS "zcoll: SMPI build (${SIMGRID_LIBRARY}); run the programs with ${SMPIRUN_EXECUTABLE}")
