# Installs the built engine into a fresh prefix, then builds and runs consumers against the installed tree
# only: a C program through pkg-config, and the CMake project in this directory (find_package: the C API's
# shared library, the static C++ library, the imported CLI). The C and C++ consumers must print the same
# trajectories bit for bit.
#   cmake -DBUILD_DIR=build -DCONSUMER_DIR=tests/consumer -DWORK_DIR=/tmp/x -DLIBDIR=lib -DVERSION=0.1.0 -DC_COMPILER=cc
#         -DCXX_COMPILER=c++ -P tests/consumer/run.cmake
cmake_minimum_required(VERSION 3.22)
foreach(v BUILD_DIR CONSUMER_DIR WORK_DIR LIBDIR VERSION C_COMPILER CXX_COMPILER)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "run.cmake needs -D${v}=...")
  endif()
endforeach()

function(step)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    string(REPLACE ";" " " cmd "${ARGN}")
    message(FATAL_ERROR "failed (${rc}): ${cmd}\n${out}\n${err}")
  endif()
  set(STEP_OUT "${out}" PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)
step(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})
foreach(f include/alpamayo/alpamayo.h include/alpamayo/version.h include/alpamayo/engine.h bin/alpamayo-expert
          ${LIBDIR}/libalpamayo_expert.so ${LIBDIR}/libalpamayo.a ${LIBDIR}/pkgconfig/alpamayo_expert.pc
          ${LIBDIR}/cmake/alpamayo_expert/alpamayo_expertConfig.cmake
          ${LIBDIR}/cmake/alpamayo_expert/alpamayo_expertConfigVersion.cmake)
  if(NOT EXISTS ${prefix}/${f})
    message(FATAL_ERROR "not installed: ${f}")
  endif()
endforeach()

# The CMake project: find_package, the imported CLI makes the checkpoint, C and C++ consumers.
step(${CMAKE_COMMAND} -S ${CONSUMER_DIR} -B ${WORK_DIR}/build -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH=${prefix}
     -DCMAKE_C_COMPILER=${C_COMPILER} -DCMAKE_CXX_COMPILER=${CXX_COMPILER})
step(${CMAKE_COMMAND} --build ${WORK_DIR}/build -j2)
set(ck ${WORK_DIR}/build/ck)
set(ctx ${WORK_DIR}/build/ctx.safetensors)
# The cpu backend times its kernels in each process; pin the choices the installed CLI makes, so that the
# consumers' processes compute the same bits (docs/CPU_BACKEND.md, "Pinning the choices").
if("$ENV{ALPAMAYO_CPU_KERNELS}" STREQUAL "")
  step(${prefix}/bin/alpamayo-expert inspect ${ck} --kernels)
  if(STEP_OUT MATCHES "cpu pin +ALPAMAYO_CPU_KERNELS=([^\n]+)")
    set(ENV{ALPAMAYO_CPU_KERNELS} "${CMAKE_MATCH_1}")
  endif()
endif()
step(${WORK_DIR}/build/consumer_c ${ck} ${ctx})
set(c_out "${STEP_OUT}")
step(${WORK_DIR}/build/consumer_cxx ${ck} ${ctx})
if(NOT STEP_OUT STREQUAL c_out)
  message(FATAL_ERROR "the C and C++ consumers differ:\nC:   ${c_out}\nC++: ${STEP_OUT}")
endif()

# pkg-config: the relocatable .pc file, and a plain compiler command line built from it.
set(ENV{PKG_CONFIG_PATH} ${prefix}/${LIBDIR}/pkgconfig)
step(pkg-config --modversion alpamayo_expert)
string(STRIP "${STEP_OUT}" pc_version)
if(NOT pc_version STREQUAL VERSION)
  message(FATAL_ERROR "pkg-config says version ${pc_version}, the project is ${VERSION}")
endif()
step(pkg-config --cflags --libs alpamayo_expert)
separate_arguments(pc_flags UNIX_COMMAND "${STEP_OUT}")
step(${C_COMPILER} -std=c11 -Wall -Werror ${CONSUMER_DIR}/main.c ${pc_flags} -Wl,-rpath,${prefix}/${LIBDIR}
     -o ${WORK_DIR}/consumer_pc)
step(${WORK_DIR}/consumer_pc ${ck} ${ctx})
if(NOT STEP_OUT STREQUAL c_out)
  message(FATAL_ERROR "the pkg-config build differs:\n${STEP_OUT}\nfrom\n${c_out}")
endif()
message(STATUS "installed tree OK: find_package (C and C++), pkg-config, CLI; ${c_out} (ALPAMAYO_CPU_KERNELS=$ENV{ALPAMAYO_CPU_KERNELS})")
file(REMOVE_RECURSE ${WORK_DIR})
