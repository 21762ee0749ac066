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
  set(_fusebox_wheel_lib ${FUSEBOX_WHEEL_LIBRARY})
else()
  set(_fusebox_wheel_lib $<TARGET_FILE:fusebox_shared>)
endif()
install(FILES ${_fusebox_wheel_lib} DESTINATION fusebox/lib RENAME libfusebox.so COMPONENT python)
install(FILES ${CMAKE_CURRENT_LIST_DIR}/../devices/h200-cudnn-9.19.devprop DESTINATION fusebox/devices
  COMPONENT python)
