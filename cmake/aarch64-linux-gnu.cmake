# Cross-compiling for aarch64 Linux with Debian's g++-aarch64-linux-gnu and the arm64 multiarch
# libraries (scripts/setup.sh installs them; DSV4_SETUP_AARCH64=0 skips); tests run under qemu-user.
#   cmake -S . -B build/aarch64 -G Ninja -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
# libsimdjson-dev is not co-installable for two architectures: setup.sh unpacks the arm64 one
# under build/arm64-deps (its CMake package; the header is the same as the native one).
list(APPEND CMAKE_PREFIX_PATH ${CMAKE_CURRENT_LIST_DIR}/../build/arm64-deps/usr)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
# pkg-config: the arm64 .pc files only.
set(ENV{PKG_CONFIG_LIBDIR} /usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig)
# Test discovery and ctest run the binaries under qemu (the multiarch libc provides the loader).
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64)
