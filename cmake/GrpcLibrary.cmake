# freeflow_grpc_library(TARGET PROTO_DIR NAME...): compiles NAME.proto files of PROTO_DIR
# with protoc and the gRPC C++ plugin into a static library TARGET. Generated code is not
# ours to keep warning-free: it builds without -Werror and its headers are system headers.
pkg_check_modules(FREEFLOW_GRPC REQUIRED IMPORTED_TARGET grpc++ protobuf)
find_program(FREEFLOW_PROTOC protoc REQUIRED)
find_program(FREEFLOW_GRPC_CPP_PLUGIN grpc_cpp_plugin REQUIRED)

function(freeflow_grpc_library target proto_dir)
  set(gen_dir ${CMAKE_CURRENT_BINARY_DIR}/gen)
  file(MAKE_DIRECTORY ${gen_dir})
  set(sources)
  foreach(proto ${ARGN})
    set(out ${gen_dir}/${proto}.pb.cc ${gen_dir}/${proto}.pb.h
            ${gen_dir}/${proto}.grpc.pb.cc ${gen_dir}/${proto}.grpc.pb.h)
    add_custom_command(
      OUTPUT ${out}
      COMMAND ${FREEFLOW_PROTOC} --proto_path=${proto_dir} --cpp_out=${gen_dir}
              --grpc_out=${gen_dir} --plugin=protoc-gen-grpc=${FREEFLOW_GRPC_CPP_PLUGIN}
              ${proto_dir}/${proto}.proto
      DEPENDS ${proto_dir}/${proto}.proto
      COMMENT "protoc ${proto}.proto"
      VERBATIM)
    list(APPEND sources ${out})
  endforeach()
  add_library(${target} STATIC ${sources})
  target_compile_options(${target} PRIVATE -Wno-error -w)
  target_include_directories(${target} SYSTEM PUBLIC ${gen_dir})
  target_link_libraries(${target} PUBLIC PkgConfig::FREEFLOW_GRPC)
endfunction()
