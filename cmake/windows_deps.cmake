# Third-party code for the Windows build, all from Debian (scripts/setup.sh puts it under
# build/win-deps): header-only use of nlohmann-json, fmt, CLI11, Boost (Asio, Beast), xxHash and
# cpp-httplib from their -dev packages; PCRE2 and simdjson built here from Debian's own source
# packages; GoogleTest from libgtest-dev's sources (/usr/src/googletest).
set(DSV4_WIN_DEPS ${CMAKE_SOURCE_DIR}/build/win-deps CACHE PATH "scripts/setup.sh's Windows dependencies")
if(NOT EXISTS ${DSV4_WIN_DEPS}/.dsv4-ready)
  message(FATAL_ERROR "${DSV4_WIN_DEPS}: missing; run scripts/setup.sh (it prepares the Windows dependencies)")
endif()
set(THREADS_PREFER_PTHREAD_FLAG ON)
find_package(Threads REQUIRED)

# Header-only packages: Debian's headers, linked under build/win-deps/include so the cross
# compiler sees them without the rest of /usr/include (glibc's headers).
foreach(name nlohmann_json fmt CLI11 boost_headers xxhash httplib)
  add_library(dsv4_win_${name} INTERFACE)
  target_include_directories(dsv4_win_${name} SYSTEM INTERFACE ${DSV4_WIN_DEPS}/include)
endforeach()
target_compile_definitions(dsv4_win_fmt INTERFACE FMT_HEADER_ONLY)
target_compile_definitions(dsv4_win_xxhash INTERFACE XXH_INLINE_ALL)
target_compile_definitions(dsv4_win_boost_headers INTERFACE _WIN32_WINNT=0x0A00 BOOST_ALL_NO_LIB)
target_link_libraries(dsv4_win_boost_headers INTERFACE ws2_32 mswsock)
target_compile_definitions(dsv4_win_httplib INTERFACE _WIN32_WINNT=0x0A00)
target_link_libraries(dsv4_win_httplib INTERFACE ws2_32 crypt32)
add_library(nlohmann_json::nlohmann_json ALIAS dsv4_win_nlohmann_json)
add_library(fmt::fmt ALIAS dsv4_win_fmt)
add_library(CLI11::CLI11 ALIAS dsv4_win_CLI11)
add_library(Boost::headers ALIAS dsv4_win_boost_headers)
add_library(PkgConfig::XXHASH ALIAS dsv4_win_xxhash)
add_library(PkgConfig::HTTPLIB ALIAS dsv4_win_httplib)

# simdjson: its single-file build from Debian's source package.
add_library(dsv4_win_simdjson STATIC ${DSV4_WIN_DEPS}/src/simdjson/singleheader/simdjson.cpp)
target_include_directories(dsv4_win_simdjson SYSTEM PUBLIC ${DSV4_WIN_DEPS}/src/simdjson/singleheader)
target_compile_options(dsv4_win_simdjson PRIVATE -w)
add_library(simdjson::simdjson ALIAS dsv4_win_simdjson)

# PCRE2 (8-bit, with its JIT): Debian's source package through its own CMake build.
set(PCRE2_BUILD_PCRE2_8 ON CACHE BOOL "" FORCE)
set(PCRE2_BUILD_PCRE2_16 OFF CACHE BOOL "" FORCE)
set(PCRE2_BUILD_PCRE2_32 OFF CACHE BOOL "" FORCE)
set(PCRE2_SUPPORT_JIT ON CACHE BOOL "" FORCE)
set(PCRE2_BUILD_PCRE2GREP OFF CACHE BOOL "" FORCE)
set(PCRE2_BUILD_TESTS OFF CACHE BOOL "" FORCE)
set(PCRE2_SUPPORT_LIBBZ2 OFF CACHE BOOL "" FORCE)
set(PCRE2_SUPPORT_LIBZ OFF CACHE BOOL "" FORCE)
set(PCRE2_SUPPORT_LIBEDIT OFF CACHE BOOL "" FORCE)
set(PCRE2_SUPPORT_LIBREADLINE OFF CACHE BOOL "" FORCE)
set(BUILD_SHARED_LIBS OFF CACHE BOOL "" FORCE)
set(BUILD_STATIC_LIBS ON CACHE BOOL "" FORCE)
add_subdirectory(${DSV4_WIN_DEPS}/src/pcre2 ${CMAKE_BINARY_DIR}/pcre2 EXCLUDE_FROM_ALL SYSTEM)
target_compile_options(pcre2-8-static PRIVATE -w)
add_library(PkgConfig::PCRE2 ALIAS pcre2-8-static)

# GoogleTest from libgtest-dev's sources.
if(DSV4_TESTS)
  set(gtest_disable_pthreads OFF CACHE BOOL "" FORCE)
  set(INSTALL_GTEST OFF CACHE BOOL "" FORCE)
  add_subdirectory(/usr/src/googletest ${CMAKE_BINARY_DIR}/googletest EXCLUDE_FROM_ALL SYSTEM)
  # (googletest's own CMake defines the GTest::gtest_main and GTest::gmock aliases)
endif()
