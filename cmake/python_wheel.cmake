# The Python package's wheel (pyproject.toml, scikit-build-core; docs/python.md):
# `pip wheel .` configures this project with SKBUILD set, builds the target
# fusebox_shared only, and installs the component `python`: libfusebox.so as
# fusebox/lib/libfusebox.so (one file, no soname links: the module loads it by
# path) and the H200 device-properties file as fusebox/devices/. The package's
# Python files come from python/fusebox (wheel.packages).
#
# FUSEBOX_WHEEL_LIBRARY=PATH packages a libfusebox.so built already and
# compiles nothing (ctest python_wheel: the packaging and the import, in
# seconds); the root CMakeLists.txt then includes this file alone.
if(FUSEBOX_WHEEL_LIBRARY)
  if(NOT EXISTS ${FUSEBOX_WHEEL_LIBRARY})
    message(FATAL_ERROR "FUSEBOX_WHEEL_LIBRARY: ${FUSEBOX_WHEEL_LIBRARY} does not exist")
  endif()
  file(REAL_PATH ${FUSEBOX_WHEEL_LIBRARY} _fusebox_wheel_lib)  # the file, not a soname link
  add_custom_target(fusebox_shared)  # the target pyproject.toml builds: nothing to do
else()
  set(_fusebox_wheel_lib $<TARGET_FILE:fusebox_shared>)
endif()
# EXCLUDE_FROM_ALL: only an install of the component `python` (scikit-build-core's) copies
# them, never a plain `cmake --install` of a build folder a wheel build reused.
install(FILES ${_fusebox_wheel_lib} DESTINATION fusebox/lib RENAME libfusebox.so COMPONENT python EXCLUDE_FROM_ALL)
install(FILES ${CMAKE_CURRENT_LIST_DIR}/../devices/h200-cudnn-9.27.devprop DESTINATION fusebox/devices
  COMPONENT python EXCLUDE_FROM_ALL)
