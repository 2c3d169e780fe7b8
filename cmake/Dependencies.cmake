# Third-party dependencies: the system's packages (Debian: nlohmann-json3-dev, libcli11-dev, libgtest-dev),
# else copies in ALPAMAYO_DEPS_DIR for machines without those packages and without a network (a GPU machine
# that builds the cuda backend: scripts/device-check.sh --prepare fills the folder from this machine's
# packages, and the folder travels with the working tree). Layout of the folder:
#   include/nlohmann/json.hpp   nlohmann-json (header only)            required
#   include/CLI/CLI.hpp         CLI11 (header only)                     optional: else no alpamayo-expert CLI
#   googletest/CMakeLists.txt   GoogleTest sources (built here)         optional: else no C++ test suite
set(ALPAMAYO_DEPS_DIR "${CMAKE_SOURCE_DIR}/deps" CACHE PATH
    "Folder with dependency copies for machines without the -dev packages (scripts/device-check.sh --prepare)")

find_package(nlohmann_json 3.10 QUIET)
if(NOT nlohmann_json_FOUND)
  if(EXISTS "${ALPAMAYO_DEPS_DIR}/include/nlohmann/json.hpp")
    add_library(nlohmann_json::nlohmann_json INTERFACE IMPORTED)
    target_include_directories(nlohmann_json::nlohmann_json INTERFACE "${ALPAMAYO_DEPS_DIR}/include")
    message(STATUS "nlohmann-json: ${ALPAMAYO_DEPS_DIR}/include")
  else()
    message(FATAL_ERROR "nlohmann-json not found: install nlohmann-json3-dev, or copy its headers to "
                        "${ALPAMAYO_DEPS_DIR}/include/nlohmann (scripts/device-check.sh --prepare does)")
  endif()
endif()

find_package(CLI11 QUIET)
if(NOT TARGET CLI11::CLI11 AND EXISTS "${ALPAMAYO_DEPS_DIR}/include/CLI/CLI.hpp")
  add_library(CLI11::CLI11 INTERFACE IMPORTED)
  target_include_directories(CLI11::CLI11 INTERFACE "${ALPAMAYO_DEPS_DIR}/include")
  message(STATUS "CLI11: ${ALPAMAYO_DEPS_DIR}/include")
endif()

if(ALPAMAYO_BUILD_TESTS)
  find_package(GTest QUIET)
  if(NOT TARGET GTest::gtest_main AND EXISTS "${ALPAMAYO_DEPS_DIR}/googletest/CMakeLists.txt")
    set(BUILD_GMOCK OFF CACHE BOOL "" FORCE)
    set(INSTALL_GTEST OFF CACHE BOOL "" FORCE)
    add_subdirectory("${ALPAMAYO_DEPS_DIR}/googletest" "${CMAKE_BINARY_DIR}/googletest" EXCLUDE_FROM_ALL)
    message(STATUS "GoogleTest: built from ${ALPAMAYO_DEPS_DIR}/googletest")
  endif()
endif()
