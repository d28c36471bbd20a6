// What windows.cc and read_queue_iocp.cc share (include after <windows.h>).
#pragma once

#include <string>

namespace dsv4::platform {

std::wstring widen(const std::string& utf8);
std::string narrow(const std::wstring& wide);
std::wstring native_path(const std::string& utf8);
int errno_from(DWORD error);  // the nearest errno for a Win32 error code
HANDLE handle_of(int fd);     // the HANDLE under a C runtime descriptor

}  // namespace dsv4::platform
